"""gridmem as an OpenAI Agents SDK session (extra `gridmem[openai-agents]`).

    from agents import Agent, Runner
    from gridmem.integrations.openai_agents import GridmemSession

    session = GridmemSession(f"{avatar_uuid}:im", store)   # store: AsyncConversationStore
    result = await Runner.run(agent, "hello", session=session)

`GridmemSession` satisfies `agents.memory.Session`. What the runner adds is mapped
to records (gridmem/integrations/mapping.py): a user message -> AvatarMessage, an
assistant message -> AgentReply (its output text), a tool's output
(`function_call_output`, and any other `*_call_output`) -> ToolSummary named after
its call (its text parts; "(no text output)" when it has none); a system or
developer message is refused (InvalidInput, nothing of the batch stored). Items
with no visible words are not stored: the model's calls (`function_call`,
`web_search_call` and every other `*_call`), its hidden reasoning (`reasoning`:
gridmem stores none). `get_items` is
`context()`: the factual summary and tool outputs come back as user messages
marked untrusted, never as system messages. docs/integrations.md says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import Literal

from gridmem.errors import InvalidInput
from gridmem.integrations.mapping import INSTRUCTION_ROLES
from gridmem.integrations.mapping import parse_session_id
from gridmem.integrations.mapping import popped_message
from gridmem.integrations.mapping import record_for
from gridmem.integrations.mapping import refuse_instructions
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import ToolSummary
from gridmem.store import AsyncConversationStore

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from openai.types.responses import EasyInputMessageParam

# Items the runner stores that hold no words a person saw: not stored. So is every
# call the model makes (`*_call`: function_call, web_search_call, file_search_call,
# computer_call, code_interpreter_call, mcp_call, ...), as a function call is.
UNSTORED_TYPES = frozenset(
    {"reasoning", "item_reference", "mcp_list_tools", "mcp_approval_request", "compaction"}
)
# A tool's answer to a call: stored as the tool's output (text, else NO_OUTPUT).
TOOL_OUTPUT_SUFFIX = "_call_output"
_Record = AvatarMessage | AgentReply | ToolSummary


class GridmemSession:
    """One (avatar, channel) conversation as an Agents SDK session, over an
    AsyncConversationStore. session_id is `<avatar-uuid>:<channel>`."""

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, store: AsyncConversationStore) -> None:
        key = parse_session_id(session_id)
        self.avatar_uuid, self.channel = key.avatar_uuid, key.channel
        self.session_id = f"{key.avatar_uuid}:{key.channel.value}"
        self.store = store

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation as context() gives it (summary first), the latest `limit`."""
        messages = await self.store.context(self.avatar_uuid, self.channel)
        if limit is not None:
            messages = messages[-limit:] if limit > 0 else []
        return [_item(m.role, m.content) for m in messages]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items in order; all are checked first, so a refused one stores none."""
        records = records_for_items(items)
        for record in records:  # all checked before the first write: refused whole
            await self.store.check_record(record)
        for record in records:
            await self.store.record(self.avatar_uuid, self.channel, record)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest live record (gridmem's pop_newest, atomic) and return it."""
        view = await self.store.pop_newest(self.avatar_uuid, self.channel)
        if view is None:
            return None
        message = popped_message(view)
        return _item(message.role, message.content)

    async def clear_session(self) -> None:
        """Remove the session whole (event deleted_operator)."""
        await self.store.delete(self.avatar_uuid, self.channel)


def _item(role: Literal["user", "assistant"], content: str) -> TResponseInputItem:
    item: EasyInputMessageParam = {"role": role, "content": content}
    return item


def records_for_items(items: list[TResponseInputItem]) -> list[_Record]:
    """The records of a batch of runner items (module docstring), in order; raises
    InvalidInput for an instruction or an item of no known shape."""
    names: dict[str, str] = {}  # call_id -> tool name, from the batch's function_call items
    records: list[_Record] = []
    for raw in items:
        item: Mapping[str, Any] = raw
        kind = item.get("type")
        if kind == "function_call":
            names[str(item.get("call_id"))] = str(item.get("name"))
        if isinstance(kind, str) and kind.endswith(TOOL_OUTPUT_SUFFIX):
            tool = names.get(str(item.get("call_id")), kind.removesuffix(TOOL_OUTPUT_SUFFIX))
            records.append(record_for("tool", _output_text(item.get("output")), tool))
            continue
        if kind in UNSTORED_TYPES or (isinstance(kind, str) and kind.endswith("_call")):
            continue
        if kind not in (None, "message"):
            raise InvalidInput("items", f"an item of type {kind!r} has no gridmem record kind")
        role = str(item.get("role"))
        if role in INSTRUCTION_ROLES:  # refused as what it is, whatever its content holds
            raise refuse_instructions(role)
        words = _content_text(item.get("content"))
        if role == "assistant" and not words.strip():
            continue  # nothing visible was said
        records.append(record_for(role, words))
    return records


def _content_text(content: object) -> str:
    """A message's words: a string, or its text parts (input_text, output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput("content", "must be a string or a list of text parts")
    parts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in _TEXT_PARTS:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidInput("content", f"a {kind!r} part is not text: gridmem stores text only")
        words = part.get("text") if "text" in part else part.get("refusal")
        parts.append(words if isinstance(words, str) else "")  # a None text is no words
    return "\n".join(parts)


_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _output_text(output: object) -> str:
    """A tool output's words: a string, or its text parts; "" (stored as NO_OUTPUT)
    for an output that holds no text (a screenshot, an image, a file)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        texts = [p for p in output if isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS]
        return _content_text(texts)
    return ""
