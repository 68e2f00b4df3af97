"""The session calls: one typed method per operation that reads or writes a session or
its shard. Each talks to no server: it returns a call (gridmem/replies.py), a
`ScriptCall` where the change needs Lua to be atomic (its script checks the
arguments), or plain commands where it does not (`CommandCall`, `ReadCall`: their
arguments checked here first, gridmem/arguments.py, as a script would)."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

from gridmem.arguments import ENTRY_ID
from gridmem.arguments import bad_argument
from gridmem.arguments import integer
from gridmem.arguments import matching
from gridmem.config import LIMIT_FIELDS
from gridmem.config import LOW_WATER
from gridmem.config import MAX_EVICTIONS_PER_CALL
from gridmem.config import SUMMARY_LINE_BYTES
from gridmem.config import WRITE_SWEEP_BATCH
from gridmem.config import Limits
from gridmem.config import shard_limits
from gridmem.keys import SHARD_PARTS
from gridmem.keys import TEMPLATE_FIELD
from gridmem.keys import SessionKeys
from gridmem.keys import ShardKeys
from gridmem.replies import ClockReading
from gridmem.replies import CommandCall
from gridmem.replies import ExportReply
from gridmem.replies import MetadataReply
from gridmem.replies import PageReply
from gridmem.replies import PopReply
from gridmem.replies import ReadCall
from gridmem.replies import RecordReply
from gridmem.replies import ScriptCall
from gridmem.replies import ScriptCalls
from gridmem.replies import StatsReply
from gridmem.replies import _parse_events
from gridmem.replies import _parse_export
from gridmem.replies import _parse_metadata
from gridmem.replies import _parse_page
from gridmem.replies import _parse_pop
from gridmem.replies import _parse_receipt
from gridmem.replies import _parse_record
from gridmem.replies import _parse_stats
from gridmem.replies import _segment
from gridmem.replies import text
from gridmem.validate import EVENTS_COUNT_MAX


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


# A published limit's name; a key name or template (<uuid>, <channel> mark its slots).
_LIMIT_NAME = re.compile(r"[a-z_]+")
_KEY_TEMPLATE = re.compile(r"[A-Za-z0-9_\-:{}<>]+")


def _published(name: str, value: int | str) -> tuple[str, int | str]:
    """One field of a shard's limits hash, checked: a lowercase name; a key name or template
    for a key_<name> field, else an integer >= 0."""
    matching("limit", name, _LIMIT_NAME)
    if name.startswith(TEMPLATE_FIELD):
        return name, matching(name, value, _KEY_TEMPLATE)
    return name, integer(name, value, 0)


def _text_or_empty(reply: Any) -> str:
    return "" if reply is None else text(reply)


_SHARD_PARTS = operator.attrgetter(*SHARD_PARTS)


def shard_script_keys(shard: ShardKeys, session: SessionKeys | None = None) -> tuple[str, ...]:
    """The one KEYS layout of every script that keeps a shard (record_turn,
    restore_session, sweep_idle, delete_session): the session's keys first where it has
    one (SESSION_PARTS order), then the shard's (SHARD_PARTS order). lib.lua's
    shard_script_keys reads them back by name."""
    parts: tuple[str, ...] = _SHARD_PARTS(shard)
    return parts if session is None else session.all() + parts


class SessionCalls(ScriptCalls):
    """One typed method per session operation. Holds the scripts' sources; never a connection."""

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
        required_session_id: str = "",
    ) -> ScriptCall[RecordReply]:
        """`required_session_id`: '' for any session, else store only into the live
        session of that ID (RecordReply.session_id is '' when it has ended)."""
        return self._call(
            "record_turn",
            shard_script_keys(shard, session),
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
                required_session_id,
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
            "sweep_idle", shard_script_keys(shard), (*clock.args(), batch, max_events), int
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
            shard_script_keys(shard, session),
            (now_wall, session.member, reason, max_events),
            bool,
        )

    def pop_newest(
        self,
        session: SessionKeys,
        shard: ShardKeys,
        clock: ClockReading,
        *,
        max_events: int,
    ) -> ScriptCall[PopReply]:
        return self._call(
            "pop_newest",
            shard_script_keys(shard, session),
            (*clock.args(), session.member, max_events),
            _parse_pop,
            idempotent=False,  # a resend would pop a second record
        )

    def read_events(
        self, shard: ShardKeys, *, after: str, count: int
    ) -> CommandCall[list[tuple[str, dict[str, str]]]]:
        """The next `count` (1..EVENTS_COUNT_MAX) events of one shard's stream after the
        event ID `after` ('' for the oldest kept), oldest first. Reason codes and counts,
        never content. A plain read: it runs on a full server too."""
        start = "(" + matching("after", after, ENTRY_ID) if after else "-"
        most = integer("count", count, 1, EVENTS_COUNT_MAX)
        return CommandCall((("XRANGE", shard.events, start, "+", "COUNT", most),), _parse_events)

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
            shard_script_keys(shard, session),
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

    def read_stats(self, shard: ShardKeys) -> ReadCall[StatsReply]:
        """One shard's totals, read together: live sessions per channel, its stats hash
        (bytes, redactions, events:<reason> counts) and the limits it published. Counts
        only: no content, no UUIDs."""
        commands = (
            ("ZCARD", shard.lru_public),
            ("ZCARD", shard.lru_im),
            ("HGETALL", shard.stats),
            ("HGETALL", shard.limits),
        )
        return ReadCall(commands, _parse_stats)

    def publish_limits(self, shard: ShardKeys, limits: dict[str, int | str]) -> CommandCall[int]:
        """Record what one shard runs with, for bin/gridmem-cli (DESIGN section 12),
        replacing the hash whole: names are lowercase words, values integers >= 0,
        except a key_<name> field's, a key name or template (keys.KeySpace.templates).
        How many were recorded."""
        if not limits:
            raise bad_argument("limits")
        pairs = [x for name in sorted(limits) for x in _published(name, limits[name])]
        commands = (("DEL", shard.limits), ("HSET", shard.limits, *pairs))
        return CommandCall(commands, lambda _: len(limits))

    def publish_layout(
        self, layout: str, *, namespace: str, prefixes: Sequence[str]
    ) -> ScriptCall[int]:
        return self._call("publish_layout", (layout,), (namespace, *prefixes), int)

    def mark_restored(self, shard: ShardKeys, *, generation: int | None) -> CommandCall[str]:
        """The marker saying this server's data was restored from snapshot `generation`:
        its value before this call ('' if unset), and set to `generation` unless None.
        It lives as long as the server's data: a restarted server (which keeps nothing)
        restores again. GET and SET in one MULTI/EXEC, as atomic as SET ... GET, whose
        reply redis-py would turn into a bool. Safe to resend: it sets the same value."""
        if generation is None:
            return CommandCall((("GET", shard.restored),), _text_or_empty)
        number = integer("generation", generation, 0)
        commands = (("GET", shard.restored), ("SET", shard.restored, number))
        return CommandCall(commands, lambda replies: _text_or_empty(replies[0]))
