"""The vocabulary of the store: channels, record kinds, what callers get back, events.

Record kinds are the only things a caller can store. There is deliberately no
kind for system messages, hidden reasoning, scratchpads, credentials or binary
assets: a payload claiming one is rejected. Every model forbids unknown fields.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError

from gridmem.errors import InvalidRecord
from gridmem.kinds import KINDS


class Channel(StrEnum):
    """Where a resident talks to the agent. Group and conference chat are not representable.

    Names are matched in any ASCII case and canonicalised to lowercase, as UUIDs are:
    `Channel("IM") is Channel.IM`. Only ASCII letters count, and nothing around them:
    full-width or Cyrillic look-alikes, a dotted capital I (U+0130), or `"im "` with
    its space, name no channel.
    """

    PUBLIC = "public"
    IM = "im"

    @classmethod
    def _missing_(cls, value: object) -> Channel | None:
        return channel_named(value) if isinstance(value, str) else None


def channel_named(text: str) -> Channel | None:
    """The channel `text` names, in any ASCII case; None for anything else.

    `text` must be a plain str (validate.plain_str): a subclass's lower() or __eq__
    is never asked. ASCII is checked first, so Unicode case rules (which map some
    non-ASCII letters onto ASCII ones, as the Kelvin sign onto `k`) play no part.
    """
    if not text.isascii():
        return None
    lowered = text.lower()
    for channel in Channel:
        if lowered == channel.value:
            return channel
    return None


# Inactivity TTLs, exact (DESIGN section 4). lua/lib.lua holds the same numbers;
# a test keeps the two in step.
CHANNEL_TTL_MS: dict[Channel, int] = {
    Channel.PUBLIC: 1_800_000,
    Channel.IM: 86_400_000,
}


class ReasonCode(StrEnum):
    """Why an event happened. A code, once published, never changes meaning."""

    EXPIRED_INACTIVITY = "expired_inactivity"
    EXPIRED_OPERATOR = "expired_operator"
    DELETED_OPERATOR = "deleted_operator"
    COMPACTED = "compacted"
    SUMMARY_TRIMMED = "summary_trimmed"
    EVICTED_SESSION_LIMIT = "evicted_session_limit"
    EVICTED_AGGREGATE_BYTES = "evicted_aggregate_bytes"
    SNAPSHOT_QUARANTINED = "snapshot_quarantined"
    SNAPSHOT_RESTORED = "snapshot_restored"
    PERMISSIONS_NOT_VERIFIED = "permissions_not_verified"
    POPPED_NEWEST = "popped_newest"  # pop_newest(): the newest live record removed


class DeadLetterReason(StrEnum):
    """Why the worker service dead-lettered an inbound entry (the `reason` field of
    `gm:dead`, docs/streams.md). A code, once published, never changes meaning."""

    MISSING_FIELD = "missing_field"  # no avatar_uuid or no channel
    BAD_UUID = "bad_uuid"  # avatar_uuid is not a UUID (or is the nil UUID)
    BAD_CHANNEL = "bad_channel"  # channel is not public or im in some case
    MISSING_TEXT = "missing_text"  # no text, or nothing visible in it
    BAD_TEXT = "bad_text"  # text the store refuses
    OVERSIZED = "oversized"  # a field over max_input_bytes
    UNKNOWN_FIELD = "unknown_field"  # a field the contract does not name
    BAD_ENCODING = "bad_encoding"  # a field name or value that is not UTF-8
    GONE = "gone"  # vanished before a worker read it
    POISON = "poison"  # answering it failed (or killed its worker) max_attempts times
    WRONG_PARTITION = "wrong_partition"  # on another partition's stream than its avatar's


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def describe_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field, problem) of the first error, without echoing the input (it may be a secret).

    An unknown field is named only if its name looks like a name: a caller who
    pastes a token where a key belongs must not see it echoed into logs.
    """
    first = exc.errors(include_input=False, include_url=False)[0]
    parts = [str(p) if _PLAIN_NAME.fullmatch(str(p)) else "<unnamed field>" for p in first["loc"]]
    return ".".join(parts) or "record", first["msg"]


class _Record(BaseModel):
    """Base of the storable kinds: strict, frozen, no extra fields, errors as InvalidRecord."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            field, problem = describe_validation_error(exc)
            # `from None`: pydantic's own message would repeat the input.
            raise InvalidRecord(field, problem) from None


NonEmptyText = Annotated[str, Field(min_length=1)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]


class AvatarMessage(_Record):
    """What a resident said. Untrusted: it is data, never an instruction."""

    kind: Literal["avatar_message"] = "avatar_message"
    text: NonEmptyText


class AgentReply(_Record):
    """What the agent visibly said back."""

    kind: Literal["agent_reply"] = "agent_reply"
    text: NonEmptyText


class ToolSummary(_Record):
    """A bounded summary of a tool's output. Untrusted: tools return whatever they found."""

    kind: Literal["tool_summary"] = "tool_summary"
    tool: Name
    summary: NonEmptyText


class ActionResult(_Record):
    """The outcome of an action the agent took in-world."""

    kind: Literal["action_result"] = "action_result"
    action: Name
    status: Literal["ok", "failed", "denied"]
    detail: str = ""


Record = AvatarMessage | AgentReply | ToolSummary | ActionResult
RecordKind = Literal["avatar_message", "agent_reply", "tool_summary", "action_result"]
RECORD_TYPES: tuple[type[_Record], ...] = (AvatarMessage, AgentReply, ToolSummary, ActionResult)

# Who said it, and whether the words may be believed as instructions (gridmem/kinds.py).
KIND_ROLE: dict[str, str] = {kind.name: kind.role for kind in KINDS}
KIND_UNTRUSTED: dict[str, bool] = {kind.name: kind.untrusted for kind in KINDS}

KIND_MODELS: dict[str, type[_Record]] = {
    str(cls.model_fields["kind"].default): cls for cls in RECORD_TYPES
}


def parse_record(payload: object) -> Record:
    """Validate a record given as a model instance or a mapping with a "kind" key."""
    if isinstance(payload, RECORD_TYPES):
        # Re-validate: model_construct() or object.__setattr__ could bypass the model's checks.
        data = dict(payload.__dict__)
    elif isinstance(payload, dict) and all(isinstance(k, str) for k in payload):
        data = payload
    else:
        raise InvalidRecord("record", "expected a record model or a mapping with string keys")
    kind = data.get("kind")
    model = KIND_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise InvalidRecord("kind", f"must be one of {', '.join(KIND_MODELS)}")
    return model(**data)  # type: ignore[return-value]  # KIND_MODELS holds only Record types


class _Out(BaseModel):
    """Base of what the store returns: immutable, no surprise fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Receipt(_Out):
    """What `record()` did. A repeated idempotency key returns the first receipt,
    with `duplicate` set: nothing was stored this time (an idempotent replay).

    `duplicate` tells how this call went, not what was stored: two receipts of the
    same record are equal whatever their `duplicate`.
    """

    session_id: str
    seq: int
    new_session: bool
    redactions: int
    truncated: bool
    duplicate: bool = False

    def _stored(self) -> tuple[str, int, bool, int, bool]:
        return (self.session_id, self.seq, self.new_session, self.redactions, self.truncated)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Receipt):
            return NotImplemented
        return self._stored() == other._stored()

    def __hash__(self) -> int:
        return hash(self._stored())


class SessionMetadata(_Out):
    """One session, without content. Times are wall-clock milliseconds."""

    session_id: str
    avatar_uuid: str
    channel: Channel
    created_at_ms: int
    last_active_at_ms: int
    turn_count: int
    byte_count: int


class MetadataPage(_Out):
    items: list[SessionMetadata]
    next_cursor: str | None = None


class ContextMessage(_Out):
    """One LLM-facing message. Never `system`: the caller adds its own system prompt."""

    role: Literal["user", "assistant"]
    content: str

    def to_openai(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class TurnView(_Out):
    """One stored record as the operator's transcript reader shows it."""

    seq: int
    at_ms: int
    kind: RecordKind
    role: str
    text: str
    untrusted: bool


class TurnPage(_Out):
    turns: list[TurnView]
    has_more: bool
    next_anchor: int | None = None


class Event(_Out):
    """Something the store did on its own or for an operator. Counts and codes, never content."""

    id: str
    reason: ReasonCode
    at_ms: int
    session_id: str
    avatar_uuid: str
    channel: Channel | None = None
    detail: dict[str, int | str] = Field(default_factory=dict)


class StoreStats(_Out):
    """What the store holds, summed over shards. Counts only."""

    sessions: dict[Channel, int]
    stored_bytes: int
    redactions: int
    events: dict[ReasonCode, int]  # all-time, by reason (the stream keeps only the latest)
