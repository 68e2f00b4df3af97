"""The Lua scripts: loaded once, one typed method per script.

Each method validates nothing (the store did that) and talks to no server: it
returns a `ScriptCall` naming the script, its KEYS and ARGV, and how to read the
reply. `ConversationStore` and `AsyncConversationStore` run the same calls, so
the sync and async doors can never drift apart.

The store runs every script as a function of one Redis function library
(`FunctionLibrary`: lib.lua once, then each script wrapped as a function): on
"Function not found" it does FUNCTION LOAD and retries once (store._fcall). A
library is named after a hash of its code, so workers of different versions
sharing one server each call their own functions. Compared with EVALSHA of a
script with lib.lua prepended, the helpers are defined once per load instead of
on every call: about 7 us less server time per call (docs/benchmarks.md). Each
script also stays a standalone source (lib.lua + script) for EVAL, which
bin/gridmem-cli and the Lua tests use.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from gridmem.config import SUMMARY_LINE_BYTES, Limits, shard_limits
from gridmem.keys import ServiceKeys, SessionKeys, ShardKeys

T = TypeVar("T")
Arg = str | int | bytes

SCRIPT_NAMES: tuple[str, ...] = (
    "record_turn",
    "read_page",
    "read_context",
    "list_metadata",
    "sweep_idle",
    "delete_session",
    "read_events",
    "export_sessions",
    "restore_session",
    "publish_event",
    "mark_restored",
    "read_receipt",
    "read_stats",
    "publish_limits",
    "publish_layout",
    "ensure_group",
    "take_inbound",
    "claim_key",
    "begin_attempt",
    "finish_entry",
    "renew_lease",
    "orphaned_keys",
    "read_inbound",
    "read_backlog",
    "dead_letter",
    "publish_reply",
)

# The limits packet record_turn reads (lib.lua LIMIT_FIELDS, same order).
LIMIT_FIELDS: tuple[str, ...] = (
    "max_turns",
    "low_turns",
    "max_session_bytes",
    "low_session_bytes",
    "max_tools",
    "low_tools",
    "max_summary_bytes",
    "summary_line_bytes",
    "max_sessions",
    "max_aggregate_bytes",
    "max_evictions",
    "archive",
    "max_archive_segments",
    "max_archive_bytes",
    "sweep_batch",
)
# Compaction folds a session down to this share of each bound, so it runs once
# every quarter-bound of turns rather than on every turn.
LOW_WATER = 0.75
# Sessions one record_turn call may end to get back under the shard's bounds.
MAX_EVICTIONS_PER_CALL = 1000
# Other sessions idle past their TTL that one record_turn call expires (lib.lua
# expire_idle), so a store nobody sweeps still frees expired chat as it is written
# to. More than one: a write opens at most one session, so expired ones drain
# faster than they come. Few: each victim costs the write seven more commands.
WRITE_SWEEP_BATCH = 4


def limits_packet(limits: Limits, shards: int, archive: bool = False) -> str:
    """The limits as record_turn takes them: one shard's share of the global bounds
    (config.shard_limits), whose sum over the shards never exceeds them, archives
    included when `archive` is on."""
    share = shard_limits(limits, shards, archive=archive)
    values = {
        "max_turns": limits.max_turns_per_session,
        "low_turns": max(1, int(limits.max_turns_per_session * LOW_WATER)),
        "max_session_bytes": limits.max_session_bytes,
        "low_session_bytes": int(limits.max_session_bytes * LOW_WATER),
        "max_tools": limits.max_tool_results_per_session,
        "low_tools": int(limits.max_tool_results_per_session * LOW_WATER),
        "max_summary_bytes": limits.max_summary_bytes,
        "summary_line_bytes": min(SUMMARY_LINE_BYTES, limits.max_summary_bytes),
        "max_sessions": share.max_sessions,
        "max_aggregate_bytes": share.max_aggregate_bytes,
        "max_evictions": MAX_EVICTIONS_PER_CALL,
        "archive": int(archive),
        "max_archive_segments": limits.max_archive_segments,
        "max_archive_bytes": limits.max_archive_bytes,
        "sweep_batch": WRITE_SWEEP_BATCH,
    }
    return ",".join(str(values[field]) for field in LIMIT_FIELDS)


_KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)\]", re.MULTILINE)


def lua_dir() -> Path:
    """Where the .lua files are: inside the installed package, else the source tree."""
    packaged = Path(str(resources.files("gridmem"))) / "lua"
    if (packaged / "lib.lua").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


_FLAGS_LINE = re.compile(r"^-- Flags:\s+(\S+)", re.MULTILINE)
# The script flags a gridmem function may declare; "none" declares none.
_KNOWN_FLAGS = {"no-writes", "allow-oom", "none"}


@dataclass(frozen=True, slots=True)
class FunctionLibrary:
    """Every script as a function of one library: FUNCTION LOAD once, then FCALL."""

    name: str  # gridmem_<hash of the code>: another version's library loads beside it
    code: str


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One script: its function in the library, and a standalone source for EVAL."""

    name: str
    source: str  # lib.lua + the script, for EVAL (bin/gridmem-cli, the Lua tests)
    key_count: int  # from the contract header; the wrappers must pass exactly this many
    flags: tuple[str, ...]  # from the contract header's Flags line
    function: str  # its name in `library`, for FCALL
    library: FunctionLibrary


def load_scripts(directory: Path | None = None) -> dict[str, LuaScript]:
    """Read lib.lua and every script once, and build the function library."""
    directory = directory or lua_dir()
    lib = (directory / "lib.lua").read_text(encoding="utf-8")
    bodies = {
        name: (directory / f"{name}.lua").read_text(encoding="utf-8") for name in SCRIPT_NAMES
    }
    flags = {name: _flags(name, body) for name, body in bodies.items()}
    functions = [_function_code(name, body) for name, body in bodies.items()]
    body_code = "\n".join([lib, *functions])
    tag = hashlib.sha1(body_code.encode("utf-8")).hexdigest()[:16]
    library_name = f"gridmem_{tag}"
    registrations = [
        f"redis.register_function{{function_name='{library_name}_{name}', "
        f"callback=script_{name}, flags={{{', '.join(repr(f) for f in flags[name])}}}}}"
        for name in SCRIPT_NAMES
    ]
    library = FunctionLibrary(
        library_name, "\n".join([f"#!lua name={library_name}", body_code, *registrations, ""])
    )
    scripts = {}
    for name, body in bodies.items():
        declared = [int(n) for n in _KEYS_LINE.findall(body)]
        scripts[name] = LuaScript(
            name,
            f"{lib}\n{body}",
            max(declared, default=0),
            flags[name],
            f"{library_name}_{name}",
            library,
        )
    return scripts


def _flags(name: str, body: str) -> tuple[str, ...]:
    """The Flags line of a script's header: each script states its flags on purpose."""
    found = _FLAGS_LINE.search(body)
    if found is None or found.group(1) not in _KNOWN_FLAGS:
        raise ValueError(f"lua/{name}.lua: its header needs '-- Flags: no-writes|allow-oom|none'")
    return () if found.group(1) == "none" else (found.group(1),)


def _function_code(name: str, body: str) -> str:
    """A script as a library function. Its parameters are named KEYS and ARGV, so the
    script's text is the same as for EVAL; bad_field is per call, not per load."""
    return f"local function script_{name}(KEYS, ARGV)\nbad_field = nil\n{body}\nend"


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


def _parse_events(raw: Sequence[Any]) -> list[tuple[str, dict[str, str]]]:
    out = []
    for row in raw:
        values = [text(v) for v in row]
        out.append((values[0], dict(zip(values[1::2], values[2::2], strict=True))))
    return out


@dataclass(frozen=True, slots=True)
class ExportedSession:
    member: str
    session_id: str
    created_ms: int
    active_ms: int
    summary: str
    entries: list[str]
    receipts: dict[str, str]
    archive: list[list[str]]  # segments of archived entries, oldest first


@dataclass(frozen=True, slots=True)
class ExportReply:
    next_after: str  # '' at the end of this shard
    sessions: list[ExportedSession]


def _split_segments(segments: str, entries: list[str]) -> list[list[str]]:
    """Group archived entries by the 'first-last-bytes' segment ranges that hold them."""
    grouped = []
    for item in filter(None, segments.split(",")):
        first, last, _ = (int(x) for x in item.split("-"))
        grouped.append([e for e in entries if first <= int(e.split("|", 1)[0]) <= last])
    return [segment for segment in grouped if segment]


def _parse_export(raw: Sequence[Any]) -> ExportReply:
    sessions = []
    for member, sid, created, active, summary, entries, receipts, segments, archived in raw[1:]:
        pairs = texts(receipts)
        sessions.append(
            ExportedSession(
                text(member),
                text(sid),
                int(created),
                int(active),
                text(summary),
                texts(entries),
                dict(zip(pairs[0::2], pairs[1::2], strict=True)),
                _split_segments(text(segments), texts(archived)),
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


def _parse_step(raw: Sequence[Any]) -> KeyStep:
    values = [text(v) for v in raw]
    if len(values) > 1:
        return KeyStep(values[0], values[1], int(values[2]), int(values[3]), values[4])
    return KeyStep(values[0])


@dataclass(frozen=True, slots=True)
class AttemptCount:
    """begin_attempt: the attempt now started, or lost (another worker owns the key)."""

    state: str  # ok | lost
    attempts: int = 0  # this one included
    silent: int = 0  # earlier attempts that ended without a word


def _parse_attempt(raw: Sequence[Any]) -> AttemptCount:
    values = [text(v) for v in raw]
    if len(values) > 1:
        return AttemptCount(values[0], int(values[1]), int(values[2]))
    return AttemptCount(values[0])


def _parse_raw_fields(raw: Sequence[Any]) -> list[tuple[bytes, bytes]]:
    """Field/value pairs as the bytes Redis holds: the caller decodes each strictly, since
    the bridge may write anything and one undecodable byte must not fail the whole read."""
    values = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in raw]
    return list(zip(values[0::2], values[1::2], strict=True))


@dataclass(frozen=True, slots=True)
class StatsReply:
    public: int
    im: int
    stats: dict[str, str]
    limits: dict[str, str]


def _parse_stats(raw: Sequence[Any]) -> StatsReply:
    return StatsReply(int(raw[0]), int(raw[1]), _parse_fields(raw[2]), _parse_fields(raw[3]))


def _parse_fields(raw: Sequence[Any]) -> dict[str, str]:
    values = [text(v) for v in raw]
    return dict(zip(values[0::2], values[1::2], strict=True))


def _parse_texts(raw: Sequence[Any]) -> list[str]:
    return [text(v) for v in raw]


def _writer_keys(session: SessionKeys, shard: ShardKeys) -> tuple[str, ...]:
    """KEYS of the scripts that write a session and keep its shard's bounds."""
    return (
        *session.all(),
        shard.lru_public,
        shard.lru_im,
        shard.sessions,
        shard.seq,
        shard.clock,
        shard.events,
        shard.stats,
    )


class Scripts:
    """One typed method per Lua script. Holds the sources; never a connection."""

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

    def record_turn(
        self,
        session: SessionKeys,
        shard: ShardKeys,
        clock: ClockReading,
        *,
        candidate_session_id: str,
        payload: str,
        idempotency_key: str,
        redactions: int,
        truncated: bool,
        max_events: int,
        limits: str,
    ) -> ScriptCall[RecordReply]:
        return self._call(
            "record_turn",
            _writer_keys(session, shard),
            (
                *clock.args(),
                session.member,
                candidate_session_id,
                payload,
                idempotency_key,
                redactions,
                int(truncated),
                max_events,
                limits,
            ),
            _parse_record,
            # Without an idempotency key a resend could store the turn twice.
            idempotent=bool(idempotency_key),
        )

    def read_page(
        self,
        session: SessionKeys,
        shard: ShardKeys,
        lru: str,
        clock: ClockReading,
        *,
        anchor: int | None,
        direction: str,
        limit: int,
    ) -> ScriptCall[PageReply]:
        return self._call(
            "read_page",
            (session.meta, session.turns, session.archive, lru, shard.clock),
            (*clock.args(), session.member, "" if anchor is None else anchor, direction, limit),
            _parse_page,
        )

    def list_metadata(
        self, shard: ShardKeys, clock: ClockReading, *, after: str, limit: int
    ) -> ScriptCall[MetadataReply]:
        return self._call(
            "list_metadata",
            (shard.sessions, shard.lru_public, shard.lru_im, shard.clock),
            (*clock.args(), after, limit),
            _parse_metadata,
        )

    def sweep_idle(
        self, shard: ShardKeys, clock: ClockReading, *, batch: int, max_events: int
    ) -> ScriptCall[int]:
        return self._call(
            "sweep_idle",
            (
                shard.lru_public,
                shard.lru_im,
                shard.sessions,
                shard.clock,
                shard.events,
                shard.stats,
            ),
            (*clock.args(), batch, max_events),
            int,
        )

    def delete_session(
        self,
        session: SessionKeys,
        shard: ShardKeys,
        *,
        now_wall: int,
        reason: str,
        max_events: int,
    ) -> ScriptCall[bool]:
        return self._call(
            "delete_session",
            (
                *session.all(),
                shard.lru_public,
                shard.lru_im,
                shard.sessions,
                shard.events,
                shard.stats,
            ),
            (now_wall, session.member, reason, max_events),
            bool,
        )

    def read_events(
        self, shard: ShardKeys, *, after: str, count: int
    ) -> ScriptCall[list[tuple[str, dict[str, str]]]]:
        return self._call("read_events", (shard.events,), (after, count), _parse_events)

    def export_sessions(
        self,
        shard: ShardKeys,
        clock: ClockReading,
        *,
        after: str,
        max_sessions: int,
        max_bytes: int,
    ) -> ScriptCall[ExportReply]:
        return self._call(
            "export_sessions",
            (shard.sessions, shard.lru_public, shard.lru_im, shard.clock),
            (*clock.args(), after, max_sessions, max_bytes),
            _parse_export,
        )

    def restore_session(
        self,
        session: SessionKeys,
        shard: ShardKeys,
        clock: ClockReading,
        *,
        session_id: str,
        created_ms: int,
        active_ms: int,
        age_ms: int,
        summary: str,
        max_events: int,
        limits: str,
        receipts: dict[str, str],
        entries: list[str],
        archive: list[list[str]] | None = None,
    ) -> ScriptCall[bool]:
        pairs = [x for kv in sorted(receipts.items()) for x in kv]
        segments = archive or []
        archived = [entry for segment in segments for entry in segment]
        return self._call(
            "restore_session",
            _writer_keys(session, shard),
            (
                *clock.args(),
                session.member,
                session_id,
                created_ms,
                active_ms,
                age_ms,
                summary,
                max_events,
                limits,
                len(receipts),
                ",".join(_segment(segment) for segment in segments if segment),
                len(archived),
                *pairs,
                *archived,
                *entries,
            ),
            bool,
        )

    def publish_event(
        self,
        shard: ShardKeys,
        *,
        now_wall: int,
        reason: str,
        max_events: int,
        session_id: str = "",
        member: str = "",
        detail: dict[str, str | int] | None = None,
    ) -> ScriptCall[str]:
        pairs = [str(x) for kv in (detail or {}).items() for x in kv]
        return self._call(
            "publish_event",
            (shard.events, shard.stats),
            (now_wall, reason, max_events, session_id, member, *pairs),
            text,
            idempotent=False,  # a resend would publish the event twice
        )

    def read_receipt(
        self, session: SessionKeys, shard: ShardKeys, lru: str, clock: ClockReading, *, key: str
    ) -> ScriptCall[RecordReply | None]:
        return self._call(
            "read_receipt",
            (session.meta, session.idem, lru, shard.clock),
            (*clock.args(), session.member, key),
            _parse_receipt,
        )

    def read_context(
        self, session: SessionKeys, shard: ShardKeys, lru: str, clock_fields: Sequence[str]
    ) -> ScriptCall[list[Any]]:
        """context()'s reads in one read-only function: its fallback on a full server.

        `clock_fields` are the clock hash fields the MULTI/EXEC read asks for
        (reads.clock_fields), passed on so the two reads cannot drift apart.
        """
        keys = (session.meta, shard.clock, lru, session.summary, session.turns)
        return self._call("read_context", keys, (session.member, *clock_fields), list)

    def read_stats(self, shard: ShardKeys) -> ScriptCall[StatsReply]:
        return self._call(
            "read_stats",
            (shard.lru_public, shard.lru_im, shard.stats, shard.limits),
            (),
            _parse_stats,
        )

    def publish_limits(self, shard: ShardKeys, limits: dict[str, int | str]) -> ScriptCall[int]:
        pairs = [str(x) for kv in sorted(limits.items()) for x in kv]
        return self._call("publish_limits", (shard.limits,), pairs, int)

    def publish_layout(
        self, layout: str, *, namespace: str, prefixes: Sequence[str]
    ) -> ScriptCall[int]:
        return self._call("publish_layout", (layout,), (namespace, *prefixes), int)

    def mark_restored(self, shard: ShardKeys, *, generation: int | None) -> ScriptCall[str]:
        return self._call(
            "mark_restored",
            (shard.restored,),
            ("" if generation is None else generation,),
            text,
        )

    # -- the worker service ------------------------------------------------------------

    def ensure_group(self, service: ServiceKeys, *, group: str) -> ScriptCall[bool]:
        return self._call("ensure_group", (service.inbound,), (group,), bool)

    def take_inbound(
        self, service: ServiceKeys, *, group: str, consumer: str, count: int
    ) -> ScriptCall[list[TakenEntry]]:
        return self._call(
            "take_inbound",
            (service.inbound, service.ready, service.rejected),
            (group, consumer, count),
            _parse_taken,
            # a resend would read further entries; the first batch is filed anyway
            idempotent=False,
        )

    def claim_key(
        self,
        service: ServiceKeys,
        *,
        member: str,
        owner: str,
        lease_ms: int,
        also: str = "",
    ) -> ScriptCall[KeyStep]:
        """Counts nothing: safe to resend."""
        return self._call(
            "claim_key",
            (service.ready, service.attempts, service.rejected),
            (member, owner, lease_ms, also),
            _parse_step,
        )

    def begin_attempt(
        self,
        service: ServiceKeys,
        *,
        member: str,
        owner: str,
        entry_id: str,
        token: str,
        also: str = "",
        failed: str = "",
    ) -> ScriptCall[AttemptCount]:
        """Safe to resend: the token makes a repeated call count its attempt once."""
        return self._call(
            "begin_attempt",
            (service.ready, service.attempts),
            (member, owner, entry_id, token, also, failed),
            _parse_attempt,
        )

    def finish_entry(
        self,
        service: ServiceKeys,
        *,
        group: str,
        entry_id: str,
        member: str,
        owner: str,
        lease_ms: int,
        release: bool,
    ) -> ScriptCall[KeyStep]:
        return self._call(
            "finish_entry",
            (service.inbound, service.ready, service.attempts, service.rejected),
            (group, entry_id, member, owner, lease_ms, int(release)),
            _parse_step,
        )

    def renew_lease(
        self, service: ServiceKeys, *, member: str, owner: str, lease_ms: int
    ) -> ScriptCall[bool]:
        return self._call("renew_lease", (service.ready,), (member, owner, lease_ms), bool)

    def orphaned_keys(self, service: ServiceKeys, *, sample: int) -> ScriptCall[list[str]]:
        return self._call("orphaned_keys", (service.ready,), (sample,), _parse_texts)

    def read_inbound(
        self, service: ServiceKeys, *, entry_id: str
    ) -> ScriptCall[list[tuple[bytes, bytes]]]:
        return self._call("read_inbound", (service.inbound,), (entry_id,), _parse_raw_fields)

    def read_backlog(self, service: ServiceKeys) -> ScriptCall[int]:
        return self._call("read_backlog", (service.inbound,), (), int)

    def dead_letter(
        self, service: ServiceKeys, *, entry_id: str, reason: str, max_entries: int
    ) -> ScriptCall[str]:
        return self._call(
            "dead_letter", (service.dead,), (entry_id, reason, max_entries), text, idempotent=False
        )

    def publish_reply(
        self,
        service: ServiceKeys,
        *,
        avatar_uuid: str,
        channel: str,
        text_: str,
        in_reply_to: str,
        session_id: str,
        max_entries: int,
    ) -> ScriptCall[str]:
        return self._call(
            "publish_reply",
            (service.outbound,),
            (avatar_uuid, channel, text_, in_reply_to, session_id, max_entries),
            text,
            idempotent=False,  # a resend would publish the reply twice
        )
