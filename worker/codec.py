"""The stored form of a record, and the text bounds applied before it is stored.

A transcript entry (a sorted-set member) is

    <seq>|<wall ms>|<session id>|<payload>

where Lua prepends the first three (the sequence is assigned inside the script)
and the payload is a compact JSON array made here: `["a", text]` for an avatar
message, `["r", text]` agent reply, `["t", tool, summary]` tool summary,
`["x", action, status, detail]` action result. The seq prefix keeps every
member unique. Python is the only writer of payloads and the only reader of entries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from worker.config import Limits
from worker.errors import CorruptRecord, InputTooLarge, InvalidRecord
from worker.records import (
    ActionResult,
    AgentReply,
    AvatarMessage,
    Record,
    RecordKind,
    ToolSummary,
)

TRUNCATION_MARKER = " [truncated]"

KIND_CODE: dict[RecordKind, str] = {
    "avatar_message": "a",
    "agent_reply": "r",
    "tool_summary": "t",
    "action_result": "x",
}
CODE_KIND: dict[str, RecordKind] = {code: kind for kind, code in KIND_CODE.items()}
_FIELD_COUNT = {"a": 1, "r": 1, "t": 2, "x": 3}


def bound_text(value: str, field: str, max_bytes: int, max_input_bytes: int) -> tuple[str, bool]:
    """Refuse text over the input ceiling; cut text over `max_bytes` on a UTF-8 boundary.

    Returns (text, truncated). A cut text ends with TRUNCATION_MARKER and, marker
    included, fits in `max_bytes`.
    """
    if len(value) > max_input_bytes:  # cheap pre-check: never fewer bytes than characters
        raise InputTooLarge(
            field, f"over the input ceiling of {max_input_bytes} bytes; nothing stored"
        )
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRecord(field, "is not valid Unicode text (lone surrogate)") from None
    if len(data) > max_input_bytes:
        raise InputTooLarge(
            field, f"over the input ceiling of {max_input_bytes} bytes; nothing stored"
        )
    if len(data) <= max_bytes:
        return value, False
    marker = TRUNCATION_MARKER.encode("utf-8")
    cut = max(0, max_bytes - len(marker))
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # step back off a continuation byte
        cut -= 1
    return data[:cut].decode("utf-8") + TRUNCATION_MARKER, True


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    payload: str
    truncated: bool


def prepare(record: Record, limits: Limits) -> PreparedRecord:
    """Bound every text field of a validated record and encode its payload."""
    text_limit = (limits.max_text_bytes, limits.max_input_bytes)
    fields: list[str]
    truncated = False
    match record:
        case AvatarMessage(text=t) | AgentReply(text=t):
            bounded, truncated = bound_text(t, "text", *text_limit)
            fields = [bounded]
        case ToolSummary(tool=tool, summary=summary):
            bounded, truncated = bound_text(
                summary, "summary", limits.max_tool_result_bytes, limits.max_input_bytes
            )
            fields = [tool, bounded]
        case ActionResult(action=action, status=status, detail=detail):
            bounded, truncated = bound_text(detail, "detail", *text_limit)
            fields = [action, status, bounded]
    payload = json.dumps(
        [KIND_CODE[record.kind], *fields], ensure_ascii=False, separators=(",", ":")
    )
    return PreparedRecord(payload, truncated)


class StoredEntry(NamedTuple):
    """One transcript entry as read back: kind plus its fields, in payload order.

    A NamedTuple, not a model: the read path builds one per record per call.
    """

    seq: int
    at_ms: int
    session_id: str
    kind: RecordKind
    fields: tuple[str, ...]


def decode_entries(entries: list[str], session_id: str | None = None) -> list[StoredEntry]:
    """Parse transcript entries; anything malformed is CorruptRecord, never model input.

    With `session_id`, every entry must carry it: isolation is enforced by keys,
    this catches a store damaged from outside.

    The payloads are parsed in one json.loads call (a JSON array of them): the
    read path's cost is dominated by per-entry parsing, and Python wrote every
    payload as exactly one JSON array, so a count mismatch reveals tampering.
    """
    if not entries:
        return []
    try:
        heads = [entry.split("|", 3) for entry in entries]
        payloads = json.loads("[" + ",".join(head[3] for head in heads) + "]")
        if len(payloads) != len(heads):
            raise ValueError("payload count")
        if session_id is not None and any(head[2] != session_id for head in heads):
            raise ValueError("entry of another session")
        return [_entry(head, payload) for head, payload in zip(heads, payloads, strict=True)]
    except (ValueError, KeyError, TypeError, IndexError):
        raise CorruptRecord("a stored transcript entry cannot be decoded") from None


def _entry(head: list[str], payload: object) -> StoredEntry:
    if type(payload) is not list or len(payload) != _FIELD_COUNT[payload[0]] + 1:
        raise ValueError("wrong fields")
    fields = tuple(payload[1:])
    for value in fields:
        if type(value) is not str:
            raise TypeError("field is not text")
    return StoredEntry(int(head[0]), int(head[1]), head[2], CODE_KIND[payload[0]], fields)
