"""gridmem as a LlamaIndex chat store (extra `gridmem[llama-index]`).

    from gridmem.integrations.llama_index import GridmemChatStore

    chat_store = GridmemChatStore(store)          # instead of RedisChatStore(redis_url=...)
    memory = ChatMemoryBuffer.from_defaults(chat_store=chat_store, chat_store_key=f"{uuid}:im")

A `BaseChatStore` over a ConversationStore (and, for the async variants, an
AsyncConversationStore: `async_store=`). A key is a session ID
`<avatar-uuid>:<channel>`. Mapping (gridmem/integrations/mapping.py): USER ->
AvatarMessage, ASSISTANT (and CHATBOT, MODEL) -> AgentReply, TOOL and FUNCTION ->
ToolSummary (named after additional_kwargs["name"] or ["tool_name"]; a tool
output with no text is stored as "(no text output)");
SYSTEM and DEVELOPER are refused (InvalidInput, nothing stored). What gridmem
cannot do is refused with a clear error, not done half-way: a message inserted
at a position other than the end, removing a message other than the newest
(removing the newest is gridmem's atomic pop_newest).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.base.llms.types import MessageRole
from llama_index.core.storage.chat_store.base import BaseChatStore
from pydantic import PrivateAttr

from gridmem.errors import InvalidInput
from gridmem.integrations.mapping import parse_session_id
from gridmem.integrations.mapping import popped_message
from gridmem.integrations.mapping import record_for
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import ContextMessage
from gridmem.records import ToolSummary
from gridmem.store import AsyncConversationStore
from gridmem.store import ConversationStore

_Record = AvatarMessage | AgentReply | ToolSummary
_ROLES: dict[str, str] = {
    MessageRole.USER.value: "user",
    MessageRole.ASSISTANT.value: "assistant",
    MessageRole.CHATBOT.value: "assistant",
    MessageRole.MODEL.value: "assistant",
    MessageRole.TOOL.value: "tool",
    MessageRole.FUNCTION.value: "tool",
    MessageRole.SYSTEM.value: "system",
    MessageRole.DEVELOPER.value: "developer",
}


class GridmemChatStore(BaseChatStore):
    """Chat histories keyed by `<avatar-uuid>:<channel>`, bounded, redacted, isolated."""

    _store: ConversationStore = PrivateAttr()
    _async_store: AsyncConversationStore | None = PrivateAttr(default=None)

    def __init__(
        self, store: ConversationStore, *, async_store: AsyncConversationStore | None = None
    ) -> None:
        super().__init__()
        self._store = store
        self._async_store = async_store

    @classmethod
    def class_name(cls) -> str:
        return "GridmemChatStore"

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Replace the conversation: the old session ends whole, the messages start a new one."""
        session = parse_session_id(key)
        records = records_for_messages(messages)
        for record in records:  # all checked before anything is removed
            self._store.check_record(record)
        self._store.delete(*session)
        for record in records:
            self._store.record(*session, record)

    def get_messages(self, key: str) -> list[ChatMessage]:
        return to_chat_messages(self._store.context(*parse_session_id(key)))

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        session = parse_session_id(key)
        records = records_for_messages([message])  # none: only tool calls, nothing said
        if idx is not None and idx != len(self._store.context(*session)):
            raise InvalidInput("idx", "gridmem appends only: a message cannot be inserted")
        for record in records:
            self._store.record(*session, record)

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        session = parse_session_id(key)
        messages = self.get_messages(key)
        self._store.delete(*session)
        return messages or None

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Only the newest message can go (atomically: pop_newest); another idx is refused."""
        count = len(self._store.context(*parse_session_id(key)))
        if idx >= count or idx < -count:
            return None
        if idx not in (count - 1, -1):
            raise InvalidInput(
                "idx", "gridmem removes only the newest message (delete_last_message)"
            )
        return self.delete_last_message(key)

    def delete_last_message(self, key: str) -> ChatMessage | None:
        view = self._store.pop_newest(*parse_session_id(key))
        return None if view is None else to_chat_messages([popped_message(view)])[0]

    def get_keys(self) -> list[str]:
        keys: list[str] = []
        cursor: str | None = None
        while True:
            page = self._store.list_metadata(cursor, 1000)
            keys += [f"{m.avatar_uuid}:{m.channel.value}" for m in page.items]
            if page.next_cursor is None:
                return keys
            cursor = page.next_cursor

    async def aget_messages(self, key: str) -> list[ChatMessage]:
        if self._async_store is None:
            inherited: list[ChatMessage] = await super().aget_messages(key)
            return inherited
        return to_chat_messages(await self._async_store.context(*parse_session_id(key)))

    async def async_add_message(
        self, key: str, message: ChatMessage, idx: int | None = None
    ) -> None:
        if self._async_store is None or idx is not None:
            await super().async_add_message(key, message, idx)  # type: ignore[call-arg]
            return
        session = parse_session_id(key)
        for record in records_for_messages([message]):  # none: only tool calls
            await self._async_store.record(*session, record)


def to_chat_messages(context: list[ContextMessage]) -> list[ChatMessage]:
    return [
        ChatMessage(
            role=MessageRole.ASSISTANT if m.role == "assistant" else MessageRole.USER,
            content=m.content,
        )
        for m in context
    ]


def records_for_messages(messages: list[ChatMessage]) -> list[_Record]:
    records: list[_Record] = []
    for message in messages:
        role_value = (
            message.role.value if isinstance(message.role, MessageRole) else str(message.role)
        )
        role = _ROLES.get(role_value, role_value)
        words = message.content or ""  # its text blocks, joined (images etc. are not text)
        if role == "assistant" and not words.strip():
            continue  # only tool calls: nothing visible was said
        tool: Any = message.additional_kwargs.get("name") or message.additional_kwargs.get(
            "tool_name"
        )  # a tool_call_id names a call, not a tool: then UNNAMED_TOOL
        records.append(record_for(role, words, tool))
    return records
