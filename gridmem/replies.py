"""The call and reply types: what a call carries, and how its reply is read.

Four kinds of call, each run by either executor (gridmem/executor.py) for the
store doors and the service alike: a `ScriptCall` names a Lua function, its KEYS
and ARGV; a `ReadCall` is reads in one MULTI/EXEC (a consistent read without a
script); a `CommandCall` is plain commands where atomicity needs no Lua (one
command, or a few in one MULTI/EXEC); a `Chained` call is a script call and then
reads or another script call in one MULTI/EXEC (a write and what follows it, in
one round trip). Each says how to parse its reply; the parsers turn the raw replies into
the typed values below. Talks to no server.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Generic
from typing import NamedTuple
from typing import TypeVar

from gridmem.library import LuaScript
from gridmem.library import load_scripts

T = TypeVar("T")
U = TypeVar("U")
Arg = str | int | bytes


# The per-call values below are NamedTuples, not frozen dataclasses: as immutable,
# and built in a quarter of the time (a frozen dataclass sets each field through
# object.__setattr__), which shows on the read path (docs/benchmarks.md).


class ScriptCall(NamedTuple, Generic[T]):
    """One script invocation, ready for any client to run."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    parse: Callable[[Any], T]
    # Safe to resend after a connection fault (it cannot apply twice).
    idempotent: bool = True


class ReadCall(NamedTuple, Generic[T]):
    """Read commands to run in one MULTI/EXEC, and how to read EXEC's replies.

    Always safe to resend: it writes nothing. A full Redis server refuses every
    command queued in MULTI, reads too; then `fallback`, a read-only script whose
    reply is EXEC's, runs instead, or without one the reads are sent one by one
    (plain reads a full server runs). One by one they see what EXEC would have,
    but for what the writes a full server still runs change between them: the
    deletions that free memory (delete_session, sweep_idle).
    """

    commands: tuple[tuple[Arg, ...], ...]
    parse: Callable[[list[Any]], T]
    fallback: Callable[[], ScriptCall[list[Any]]] | None = None


class CommandCall(NamedTuple, Generic[T]):
    """Plain commands for an operation that needs no Lua: one command (atomic by
    itself) sent alone, or several sent in one MULTI/EXEC. `parse` gets the lone
    command's reply, or EXEC's replies.

    `idempotent`: safe to resend after a connection fault. `answers`: an error reply
    starting with it is the call's answer, not a failure, and goes to `parse` as the
    error itself (XGROUP CREATE's BUSYGROUP: the group existed).
    """

    commands: tuple[tuple[Arg, ...], ...]
    parse: Callable[[Any], T]
    idempotent: bool = True
    answers: str = ""


class Chained(NamedTuple, Generic[T, U]):
    """A script call (the write), then reads or another script call, in one
    MULTI/EXEC: atomic, and one round trip. The service's two per message: a
    resident's words recorded and the context read right after them (reads of the
    session's slot); a reply recorded and its entry published and finished (a
    stream script: one MULTI on a single server; on a cluster, where it lies in
    another slot, the two run one after the other, the write first). Resent after
    a connection fault only if both calls are idempotent. A full server refuses it
    whole, as it refuses the write alone."""

    write: ScriptCall[T]
    then: ReadCall[U] | ScriptCall[U]


# Any of the four: what an operation (gridmem/operations.py) yields for a door to run.
AnyCall = ScriptCall[Any] | ReadCall[Any] | CommandCall[Any] | Chained[Any, Any]


class ClockReading(NamedTuple):
    mono: int
    wall: int
    boot: str

    def args(self) -> tuple[Arg, ...]:
        return (self.mono, self.wall, self.boot)


def text(value: Any) -> str:
    """A reply element as str, whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def texts(values: Sequence[Any]) -> list[str]:
    """text() of each element, without a call per element (transcripts are read whole)."""
    return [v.decode("utf-8") if type(v) is bytes else str(v) for v in values]


class RecordReply(NamedTuple):
    session_id: str
    seq: int
    new_session: bool
    duplicate: bool
    redactions: int
    truncated: bool


def _parse_record(raw: Sequence[Any]) -> RecordReply:
    sid, seq, new, dup, red, trunc = raw
    return RecordReply(text(sid), int(seq), bool(new), bool(dup), int(red), bool(trunc))


def _segment(entries: list[str]) -> str:
    """'first-last-bytes' of an archive segment (its entries in sequence order)."""
    first, last = entries[0].split("|", 1)[0], entries[-1].split("|", 1)[0]
    return f"{first}-{last}-{sum(len(e.encode('utf-8')) for e in entries)}"


def _parse_receipt(raw: Sequence[Any]) -> RecordReply | None:
    sid, receipt = text(raw[0]), text(raw[1])
    if not sid:
        return None
    seq, new, red, trunc = receipt.split(":")
    return RecordReply(sid, int(seq), new == "1", True, int(red), trunc == "1")


@dataclass(frozen=True, slots=True)
class PageReply:
    has_more: bool
    entries: list[str]


def _parse_page(raw: Sequence[Any]) -> PageReply:
    return PageReply(bool(raw[0]), texts(raw[1:]))


@dataclass(frozen=True, slots=True)
class PopReply:
    """pop_newest's answer: the removed transcript member ('' when none was popped),
    and whether the session ended whole (its last record went, or it had expired)."""

    entry: str
    ended: bool


def _parse_pop(raw: Sequence[Any]) -> PopReply:
    return PopReply(text(raw[1]) if int(raw[0]) else "", bool(int(raw[2])))


@dataclass(frozen=True, slots=True)
class MetaRow:
    member: str
    session_id: str
    created_ms: int
    active_ms: int
    turns: int
    bytes: int


@dataclass(frozen=True, slots=True)
class MetadataReply:
    next_after: str  # '' at the end of this shard
    rows: list[MetaRow]


def _parse_metadata(raw: Sequence[Any]) -> MetadataReply:
    rows = [
        MetaRow(text(m), text(s), int(c), int(a), int(t), int(b)) for m, s, c, a, t, b in raw[1:]
    ]
    return MetadataReply(text(raw[0]), rows)


def _pairs(fields: Any) -> list[tuple[Any, Any]]:
    """A hash's or a stream entry's fields as (field, value) pairs, from redis-py's reply
    callback (a dict: of a field named twice, the last value) or a raw reply (field,
    value, ...)."""
    if isinstance(fields, dict):
        return list(fields.items())
    return list(zip(fields[0::2], fields[1::2], strict=True))


def _parse_events(raw: Sequence[Any]) -> list[tuple[str, dict[str, str]]]:
    """An XRANGE of an event stream: (ID, fields) of each event, oldest first."""
    return [(text(i), {text(k): text(v) for k, v in _pairs(f)}) for i, f in raw]


@dataclass(frozen=True, slots=True)
class ExportedSession:
    member: str
    session_id: str
    created_ms: int
    active_ms: int
    summary: str
    # transcript entries as Redis stores them, UTF-8 bytes, not decoded: a snapshot
    # carries them verbatim (gridmem/snapshots.py, format 2)
    entries: list[bytes]
    receipts: dict[str, str]
    archive: list[list[bytes]]  # segments of archived entries, oldest first


@dataclass(frozen=True, slots=True)
class ExportReply:
    next_after: str  # '' at the end of this shard
    sessions: list[ExportedSession]


def raw_bytes(values: Sequence[Any]) -> list[bytes]:
    """Each reply element as bytes, whether the client decodes responses or not."""
    return [v if type(v) is bytes else str(v).encode("utf-8") for v in values]


def _split_segments(segments: str, entries: list[bytes]) -> list[list[bytes]]:
    """Group archived entries by the 'first-last-bytes' segment ranges that hold them."""
    grouped = []
    for item in filter(None, segments.split(",")):
        first, last, _ = (int(x) for x in item.split("-"))
        grouped.append([e for e in entries if first <= int(e.split(b"|", 1)[0]) <= last])
    return [segment for segment in grouped if segment]


def _parse_export(raw: Sequence[Any]) -> ExportReply:
    sessions = []
    for member, sid, created, active, summary, entries, receipts, segments, archived in raw[1:]:
        pairs = texts(receipts) if receipts else []  # most sessions have neither
        sessions.append(
            ExportedSession(
                text(member),
                text(sid),
                int(created),
                int(active),
                text(summary),
                raw_bytes(entries),
                dict(zip(pairs[0::2], pairs[1::2], strict=True)),
                _split_segments(text(segments), raw_bytes(archived)) if segments else [],
            )
        )
    return ExportReply(text(raw[0]), sessions)


@dataclass(frozen=True, slots=True)
class TakenEntry:
    entry_id: str
    member: str  # REJECTED_MEMBER when the entry is to be dead-lettered
    reason: str  # then its dead-letter code, else ''


# take_inbound files entries without a valid key under this reserved one (the nil
# UUID, which no avatar has), with their reason in {gm:inbound}:rejected.
REJECTED_MEMBER = "00000000-0000-0000-0000-000000000000:public"


def _parse_taken(raw: Sequence[Any]) -> list[TakenEntry]:
    return [TakenEntry(text(i), text(m), text(r)) for i, m, r in raw]


@dataclass(frozen=True, slots=True)
class KeyStep:
    """claim_key / finish_entry: what the worker does next with a key."""

    state: str  # ok | busy | empty | released | done | lost; the worker adds stopped
    entry_id: str = ""
    attempts: int = 0  # with ok: attempts at entry_id that have ended
    silent: int = 0  # of those, how many ended without a word (worker died or stalled)
    rejected: str = ""  # a dead-letter reason a worker decided on before it died
    # claim_key asked to begin: the attempt it counted at entry_id (and read it for),
    # and the token it was counted under (the worker's, set by the worker)
    begun: AttemptCount | None = None
    begun_token: str = ""


def _parse_step(raw: Sequence[Any]) -> KeyStep:
    if len(raw) == 1:
        return KeyStep(text(raw[0]))
    state, entry_id, rejected = text(raw[0]), text(raw[1]), text(raw[4])
    begun = _parse_attempt((raw[0], *raw[5:])) if len(raw) > 5 else None
    return KeyStep(state, entry_id, int(raw[2]), int(raw[3]), rejected, begun)


@dataclass(frozen=True, slots=True)
class AttemptCount:
    """begin_attempt: the attempt now started, or lost (another worker owns the key)."""

    state: str  # ok | lost
    attempts: int = 0  # this one included
    silent: int = 0  # earlier attempts that ended without a word
    # with ok: the entry's fields as Redis holds them (every pair, undecoded; () if the
    # entry is gone): the bridge may write anything, and the caller decodes each strictly
    fields: tuple[tuple[bytes, bytes], ...] = ()


def _parse_attempt(raw: Sequence[Any]) -> AttemptCount:
    if len(raw) > 1:
        fields = raw[3]
        pairs = zip(fields[0::2], fields[1::2], strict=True)
        return AttemptCount(
            text(raw[0]),
            int(raw[1]),
            int(raw[2]),
            tuple((_raw(name), _raw(value)) for name, value in pairs),
        )
    return AttemptCount(text(raw[0]))


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


@dataclass(frozen=True, slots=True)
class StatsReply:
    public: int
    im: int
    stats: dict[str, str]
    limits: dict[str, str]


def _parse_stats(raw: Sequence[Any]) -> StatsReply:
    """EXEC's replies to ZCARD, ZCARD, HGETALL, HGETALL (read_stats)."""
    return StatsReply(int(raw[0]), int(raw[1]), _parse_hash(raw[2]), _parse_hash(raw[3]))


def _parse_hash(raw: Any) -> dict[str, str]:
    """HGETALL's reply, a dict (redis-py's reply callback) or field, value, ... (raw)."""
    return {text(k): text(v) for k, v in _pairs(raw)}


def _parse_texts(raw: Sequence[Any]) -> list[str]:
    return [text(v) for v in raw]


class ScriptCalls:
    """The base of the typed call builders: the scripts by name, and one way to call one."""

    def __init__(self, scripts: dict[str, LuaScript] | None = None) -> None:
        self.by_name = scripts or load_scripts()

    def _call(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Arg],
        parse: Callable[[Any], T],
        *,
        idempotent: bool = True,
    ) -> ScriptCall[T]:
        return ScriptCall(self.by_name[name], tuple(keys), tuple(args), parse, idempotent)
