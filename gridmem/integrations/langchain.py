"""gridmem as a LangChain chat message history (extra `gridmem[langchain]`).

    from gridmem.integrations.langchain import GridmemChatMessageHistory

    history = GridmemChatMessageHistory(f"{avatar_uuid}:public", store)
    RunnableWithMessageHistory(chain, lambda sid: GridmemChatMessageHistory(sid, store))

A `BaseChatMessageHistory` over a ConversationStore (sync calls) and, for the
async variants, an AsyncConversationStore (`async_store=`; without one they run
the sync calls in a thread, as LangChain's defaults do). Mapping
(gridmem/integrations/mapping.py): HumanMessage -> AvatarMessage, AIMessage ->
AgentReply (its text; one that only calls tools says nothing and is not stored),
ToolMessage -> ToolSummary (named after its `name`); SystemMessage is refused
(InvalidInput, nothing of the batch stored). `messages` is `context()`: the
summary and tool outputs read back as HumanMessages marked untrusted.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage
from langchain_core.messages import BaseMessage
from langchain_core.messages import ChatMessage
from langchain_core.messages import HumanMessage
from langchain_core.messages import SystemMessage
from langchain_core.messages import ToolMessage

from gridmem.integrations.mapping import parse_session_id
from gridmem.integrations.mapping import record_for
from gridmem.integrations.mapping import unknown_role
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import ContextMessage
from gridmem.records import ToolSummary
from gridmem.store import AsyncConversationStore
from gridmem.store import ConversationStore

_Record = AvatarMessage | AgentReply | ToolSummary


class GridmemChatMessageHistory(BaseChatMessageHistory):
    """One (avatar, channel) conversation; session_id is `<avatar-uuid>:<channel>`."""

    def __init__(
        self,
        session_id: str,
        store: ConversationStore,
        *,
        async_store: AsyncConversationStore | None = None,
    ) -> None:
        key = parse_session_id(session_id)
        self.avatar_uuid, self.channel = key.avatar_uuid, key.channel
        self.session_id = f"{key.avatar_uuid}:{key.channel.value}"
        self.store = store
        self.async_store = async_store

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]  # a read, not a list
        return to_messages(self.store.context(self.avatar_uuid, self.channel))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        records = records_for_messages(messages)
        for record in records:  # all checked before the first write: refused whole
            self.store.check_record(record)
        for record in records:
            self.store.record(self.avatar_uuid, self.channel, record)

    def clear(self) -> None:
        """Remove the session whole (event deleted_operator)."""
        self.store.delete(self.avatar_uuid, self.channel)

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_store is None:
            inherited: list[BaseMessage] = await super().aget_messages()  # in a thread
            return inherited
        return to_messages(await self.async_store.context(self.avatar_uuid, self.channel))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_store is None:
            await super().aadd_messages(messages)
            return
        records = records_for_messages(messages)
        for record in records:  # all checked before the first write: refused whole
            await self.async_store.check_record(record)
        for record in records:
            await self.async_store.record(self.avatar_uuid, self.channel, record)

    async def aclear(self) -> None:
        if self.async_store is None:
            await super().aclear()
            return
        await self.async_store.delete(self.avatar_uuid, self.channel)


def to_messages(context: list[ContextMessage]) -> list[BaseMessage]:
    return [
        AIMessage(content=m.content) if m.role == "assistant" else HumanMessage(content=m.content)
        for m in context
    ]


def records_for_messages(messages: Sequence[BaseMessage]) -> list[_Record]:
    """The records of LangChain messages, in order (module docstring)."""
    records: list[_Record] = []
    for message in messages:
        words = _text(message)
        if isinstance(message, SystemMessage):
            record_for("system", words)  # raises
        elif isinstance(message, HumanMessage):
            records.append(record_for("user", words))
        elif isinstance(message, AIMessage):
            if words.strip():  # a message that only calls tools said nothing
                records.append(record_for("assistant", words))
        elif isinstance(message, ToolMessage):
            records.append(record_for("tool", words, message.name))
        elif isinstance(message, ChatMessage):
            records.append(record_for(_chat_role(message.role), words))
        else:
            raise unknown_role(message.type)
    return records


def _text(message: BaseMessage) -> str:
    """A message's text blocks joined: `.text` is a property in langchain-core 1.x, a
    method in 0.3 (both allowed by the extra)."""
    text: object = message.text
    if not isinstance(text, str) and callable(text):  # 1.x's str is callable too
        text = text()
    return str(text) if isinstance(text, str) else ""  # a plain str, not a subclass


def _chat_role(role: str) -> str:
    """A ChatMessage's free-form role, as the mapping's names ("human" is "user", ...)."""
    return {"human": "user", "ai": "assistant"}.get(role, role)
