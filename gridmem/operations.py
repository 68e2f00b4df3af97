"""What each store method does, written once for both the sync and the async door.

Every public store method is a generator here: it validates its input (before
the first yield, so bad input never reaches Redis), prepares arguments, yields
calls (gridmem/replies.py: `ScriptCall`s, and plain commands where no Lua is
needed, as context()'s `ReadCall`, gridmem/reads.py), receives their parsed
replies, and returns the result. The stores only drive these generators:
`ConversationStore` with a blocking client, `AsyncConversationStore` with an
asyncio one. This is a "sans-I/O" core.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable
from collections.abc import Generator
from typing import Any
from typing import NamedTuple
from typing import TypeVar

from gridmem.budget import budget_arguments
from gridmem.budget import fit
from gridmem.clock import Clock
from gridmem.codec import decode_entries
from gridmem.codec import record_to_entry
from gridmem.config import ConversationConfig
from gridmem.config import shard_limits
from gridmem.context import context_messages
from gridmem.context import turn_view
from gridmem.errors import InvalidInput
from gridmem.errors import RecordedWithoutContext
from gridmem.keys import KeySpace
from gridmem.keys import SessionKeys
from gridmem.keys import ShardKeys
from gridmem.prepare import Preparer
from gridmem.reads import ContextReply
from gridmem.reads import check_clock
from gridmem.reads import clock_fields
from gridmem.reads import context_read
from gridmem.records import Channel
from gridmem.records import ContextMessage
from gridmem.records import Event
from gridmem.records import MetadataPage
from gridmem.records import ReasonCode
from gridmem.records import Receipt
from gridmem.records import SessionMetadata
from gridmem.records import StoreStats
from gridmem.records import TurnPage
from gridmem.records import TurnView
from gridmem.records import parse_record
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.redaction import Redactor
from gridmem.replies import AnyCall
from gridmem.replies import Chained
from gridmem.replies import PopReply
from gridmem.replies import ScriptCall
from gridmem.scripts import ClockReading
from gridmem.scripts import ExportReply
from gridmem.scripts import MetaRow
from gridmem.scripts import RecordReply
from gridmem.scripts import Scripts
from gridmem.scripts import limits_packet
from gridmem.snapshots import SnapshotSession
from gridmem.validate import EVENTS_COUNT_MAX
from gridmem.validate import METADATA_LIMIT_MAX
from gridmem.validate import PAGE_LIMIT_MAX
from gridmem.validate import canonical_uuid
from gridmem.validate import clamped_int
from gridmem.validate import idempotency_key
from gridmem.validate import page_anchor
from gridmem.validate import page_direction
from gridmem.validate import parse_channel
from gridmem.validate import plain_str
from gridmem.validate import session_id
from gridmem.validate import session_member
from gridmem.validate import shard_number
from gridmem.validate import stream_id

T = TypeVar("T")
Op = Generator[AnyCall, Any, T]

# Sessions expired per sweep_idle call: bounds how long one script blocks the server.
# (Each record() also expires a few: scripts.WRITE_SWEEP_BATCH, in the limits packet.)
SWEEP_BATCH = 200
# A writing store publishes its layout and limits again this often (publish_limits),
# so a server restarted or flushed behind its back shows them to operators again.
REPUBLISH_MS = 60_000
# One export_sessions call reads at most this many sessions or about this many bytes
# (at least one session whole). Its server time grows with the bytes it reads: 256 KiB
# a call blocked the server 3.4 ms (median) to 12 ms; 64 KiB keeps a call near 1 ms,
# under the 5 ms bound of docs/benchmarks.md, for a few more round trips.
EXPORT_BATCH_SESSIONS = 32
EXPORT_BATCH_BYTES = 64 << 10


def new_session_id() -> str:
    """128 random bits, hex: unguessable and never reused in practice."""
    return secrets.token_hex(16)


class Operations:
    """The store's behaviour, independent of how replies arrive."""

    def __init__(
        self,
        config: ConversationConfig,
        clock: Clock,
        scripts: Scripts | None = None,
        session_ids: Callable[[], str] = new_session_id,
        redactor: Redactor = DEFAULT_REDACTOR,
    ) -> None:
        self.config = config
        self.clock = clock
        self.keys = KeySpace(config.namespace, config.shards)
        self.scripts = scripts or Scripts()
        self._session_ids = session_ids
        self.prepare = Preparer(config.limits, redactor)
        self._limits_packet = limits_packet(config.limits, config.shards, config.archive_enabled)
        # each shard's event stream MAXLEN: its share of max_events (config.shard_limits)
        self._events_maxlen = shard_limits(
            config.limits, config.shards, archive=config.archive_enabled
        ).max_events
        # Layout and limits are published before this store's first write, then again
        # every REPUBLISH_MS it writes (publish_limits): monotonic ms of the last time.
        self._published_at: int | None = None

    def _now(self) -> ClockReading:
        """The clock, checked as the scripts check it: a Clock is caller code too, and a
        bad reading (negative, a float, an odd boot id) must fail before any command."""
        reading = self._reading()
        check_clock(reading)
        return reading

    def _reading(self) -> ClockReading:
        """The clock unchecked, for context_read, which checks it itself."""
        return ClockReading(self.clock.monotonic_ms(), self.clock.wall_ms(), self.clock.boot_id())

    def record(
        self, avatar_uuid: object, channel: object, record: object, idempotency_key_: object = None
    ) -> Op[Receipt]:
        """Store one record; Receipt.duplicate says the idempotency key had been seen
        (nothing stored)."""
        turn = yield from self._record_turn(avatar_uuid, channel, record, idempotency_key_)
        reply = yield turn.call
        return _receipt(reply, duplicate=reply.duplicate)

    def record_and_context(
        self,
        avatar_uuid: object,
        channel: object,
        record: object,
        idempotency_key_: object = None,
        *,
        max_tokens: object = None,
        count_tokens: object = None,
    ) -> Op[tuple[Receipt, list[ContextMessage]]]:
        """record(), then context() as it stands right after it, in one atomic round
        trip (a Chained call): what the service does with a resident's words."""
        budget, count = budget_arguments(max_tokens, count_tokens)
        turn = yield from self._record_turn(avatar_uuid, channel, record, idempotency_key_)
        read = context_read(turn.session, turn.shard, turn.channel, turn.now)
        reply, context = yield Chained(turn.call, read)
        receipt = _receipt(reply, duplicate=reply.duplicate)
        try:
            return receipt, _context(context, budget, count)
        except Exception as exc:  # the caller's counter failed after the record was stored
            raise RecordedWithoutContext(receipt) from exc

    def record_in_session(
        self,
        avatar_uuid: object,
        channel: object,
        record: object,
        session_id_: object,
        idempotency_key_: object = None,
    ) -> Op[Receipt | None]:
        """record(), only into the live session `session_id_`; None (nothing stored)
        if that session has ended: an answer goes into the session whose context it
        answers, never into a new one."""
        required = session_id(session_id_)
        turn = yield from self._record_turn(
            avatar_uuid, channel, record, idempotency_key_, required
        )
        reply = yield turn.call
        return _stored(reply)

    def record_in_session_then(
        self,
        avatar_uuid: object,
        channel: object,
        record: object,
        session_id_: object,
        idempotency_key_: object,
        *,
        then: ScriptCall[T],
    ) -> Op[tuple[Receipt | None, T]]:
        """record_in_session(), then `then` (a call of the service's), in one MULTI/EXEC
        where they share a slot (any single server), else right after it."""
        required = session_id(session_id_)
        turn = yield from self._record_turn(
            avatar_uuid, channel, record, idempotency_key_, required
        )
        reply, after = yield Chained(turn.call, then)
        return _stored(reply), after

    def check_record(self, record: object) -> None:
        """What record() refuses in a record itself (its kind and fields, the input
        ceiling, a credential-looking tool or action name), refused here with the same
        error; nothing is sent. Redaction and bounds run as record() runs them."""
        self.prepare.record(parse_record(record))

    def _record_turn(
        self,
        avatar_uuid: object,
        channel: object,
        record: object,
        idempotency_key_: object,
        required: str = "",
    ) -> Generator[AnyCall, Any, _Turn]:
        """record()'s input checked and prepared (before any command), the layout and
        limits published when due; the record_turn call to send (into the live session
        `required` only, when given: a checked session ID)."""
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        idem = self.prepare.name(idempotency_key(idempotency_key_), "idempotency_key")
        prepared = self.prepare.record(parse_record(record))
        now = self._now()  # checked before any command, the publish below included
        if self._published_at is None or now.mono - self._published_at >= REPUBLISH_MS:
            yield from self.publish_limits(now.mono)
        session, shard = self.keys.session(uuid, ch)
        call = self.scripts.record_turn(
            session,
            shard,
            now,
            candidate_session_id=self._session_ids(),
            payload=prepared.payload,
            idempotency_key=idem,
            redactions=prepared.redactions,
            truncated=prepared.truncated,
            max_events=self._events_maxlen,
            limits=self._limits_packet,
            required_session_id=required,
        )
        return _Turn(call, session, shard, ch, now)

    def receipt(
        self, avatar_uuid: object, channel: object, idempotency_key_: object
    ) -> Op[Receipt | None]:
        """The receipt kept for an idempotency key in the live session, or None."""
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        key = idempotency_key(idempotency_key_)
        if not key:
            raise InvalidInput("idempotency_key", "must be given")
        session, shard = self.keys.session(uuid, ch)
        reply = yield self.scripts.read_receipt(session, shard, shard.lru(ch), self._now(), key=key)
        return None if reply is None else _receipt(reply)

    def context(
        self,
        avatar_uuid: object,
        channel: object,
        max_tokens: object = None,
        count_tokens: object = None,
    ) -> Op[list[ContextMessage]]:
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        budget, count = budget_arguments(max_tokens, count_tokens)
        session, shard = self.keys.session(uuid, ch)
        reading = self._reading()
        reply = yield context_read(
            session,
            shard,
            ch,
            reading,
            lambda: self.scripts.read_context(
                session, shard, shard.lru(ch), clock_fields(reading.boot)
            ),
        )
        return _context(reply, budget, count)

    def read_page(
        self,
        avatar_uuid: object,
        channel: object,
        anchor: object = None,
        direction: object = "backward",
        limit: object = 50,
    ) -> Op[TurnPage]:
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        start, way = page_anchor(anchor), page_direction(direction)
        count = clamped_int(limit, "limit", 1, PAGE_LIMIT_MAX)
        session, shard = self.keys.session(uuid, ch)
        reply = yield self.scripts.read_page(
            session, shard, shard.lru(ch), self._now(), anchor=start, direction=way, limit=count
        )
        turns = [turn_view(entry) for entry in decode_entries(reply.entries)]
        next_anchor = None
        if turns:
            next_anchor = turns[0].seq if way == "backward" else turns[-1].seq
        return TurnPage(turns=turns, has_more=reply.has_more, next_anchor=next_anchor)

    def list_metadata(self, cursor: object = None, limit: object = 100) -> Op[MetadataPage]:
        shard_no, after = self._parse_cursor(cursor)
        want = clamped_int(limit, "limit", 1, METADATA_LIMIT_MAX)
        items: list[SessionMetadata] = []
        while shard_no < self.keys.shards and len(items) < want:
            reply = yield self.scripts.list_metadata(
                self.keys.shard(shard_no), self._now(), after=after, limit=want - len(items)
            )
            items.extend(_metadata(row) for row in reply.rows)
            if reply.next_after:
                return MetadataPage(items=items, next_cursor=f"{shard_no}:{reply.next_after}")
            shard_no, after = shard_no + 1, ""
        more = shard_no < self.keys.shards
        return MetadataPage(items=items, next_cursor=f"{shard_no}:" if more else None)

    def _parse_cursor(self, cursor: object) -> tuple[int, str]:
        if cursor is None:
            return 0, ""
        text = plain_str(cursor)
        if text is None or ":" not in text:
            raise InvalidInput("cursor", "must be None or a cursor as returned by list_metadata()")
        shard_text, after = text.split(":", 1)
        shard_no = shard_number(shard_text, self.keys.shards, "cursor")
        return shard_no, session_member(after, "cursor") if after else ""

    def end_session(self, avatar_uuid: object, channel: object, reason: ReasonCode) -> Op[bool]:
        """Operator deletion or expiry: the session goes whole, with one event."""
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        session, shard = self.keys.session(uuid, ch)
        removed: bool = yield self.scripts.delete_session(
            session,
            shard,
            now_wall=self._now().wall,
            reason=reason.value,
            max_events=self._events_maxlen,
        )
        return removed

    def pop_newest(self, avatar_uuid: object, channel: object) -> Op[TurnView | None]:
        """Remove the session's newest live record (event popped_newest); it as the
        operator's reader shows it, or None when the session holds none. The last
        record takes the session with it. Not activity."""
        uuid, ch = canonical_uuid(avatar_uuid), parse_channel(channel)
        session, shard = self.keys.session(uuid, ch)
        reply: PopReply = yield self.scripts.pop_newest(
            session, shard, self._now(), max_events=self._events_maxlen
        )
        if not reply.entry:
            return None
        return turn_view(decode_entries([reply.entry])[0])

    def sweep(self, limit: object = 1000) -> Op[int]:
        """Expire idle sessions of every shard. Writes already expire a few of their
        shard's each (record_turn); this frees the rest, e.g. when nobody writes."""
        budget = clamped_int(limit, "limit", 0, 1_000_000)
        total = 0
        for shard in self.keys.all_shards():
            while total < budget:
                batch = min(SWEEP_BATCH, budget - total)
                expired: int = yield self.scripts.sweep_idle(
                    shard, self._now(), batch=batch, max_events=self._events_maxlen
                )
                total += expired
                if expired < batch:
                    break
        return total

    def events(self, after: object = None, count: object = 100) -> Op[list[Event]]:
        """Events oldest first, across shards.

        With one shard an event id is its stream ID. With several, it is the
        comma-joined position in every shard's stream after that event, so passing
        the last id seen as `after` resumes every stream exactly where it stopped.
        """
        positions = self._parse_event_cursor(after)
        want = clamped_int(count, "count", 1, EVENTS_COUNT_MAX)
        pending: list[tuple[tuple[int, int, int], str, dict[str, str]]] = []
        for shard in self.keys.all_shards():
            rows = yield self.scripts.read_events(shard, after=positions[shard.shard], count=want)
            for entry_id, fields in rows:
                ms, seq = entry_id.split("-")
                pending.append(((int(ms), int(seq), shard.shard), entry_id, fields))
        pending.sort(key=lambda item: item[0])
        events = []
        for (_, _, shard_no), entry_id, fields in pending[:want]:
            positions[shard_no] = entry_id
            event_id = entry_id if len(positions) == 1 else ",".join(positions)
            events.append(_event(event_id, fields))
        return events

    def stats(self) -> Op[StoreStats]:
        sessions = {Channel.PUBLIC: 0, Channel.IM: 0}
        totals: Counter[str] = Counter()
        for shard in self.keys.all_shards():
            reply = yield self.scripts.read_stats(shard)
            sessions[Channel.PUBLIC] += reply.public
            sessions[Channel.IM] += reply.im
            totals.update({k: int(v) for k, v in reply.stats.items() if v.lstrip("-").isdigit()})
        events = {
            code: totals[f"events:{code.value}"]
            for code in ReasonCode
            if totals[f"events:{code.value}"]
        }
        return StoreStats(
            sessions=sessions,
            stored_bytes=totals["bytes"],
            redactions=totals["redactions"],
            events=events,
        )

    def publish_limits(self, now_mono: int | None = None) -> Op[None]:
        """Publish the layout and limits this store runs with, for bin/gridmem-cli.

        Runs before a store's first write, then at most once a minute while it
        writes (and at service start), so whatever wrote a session has said where it
        lives, even after the server lost it. Every shard's limits hash first, then
        the namespace's layout entry: a CLI that finds the layout finds everything
        it points to.
        """
        published_at = self._now().mono if now_mono is None else now_mono
        limits = self.config.limits.model_dump()
        for shard in self.keys.all_shards():
            # and its key names (templates): the CLI builds none of its own
            published = {**limits, **self._shard_bounds(shard), **self.keys.templates(shard.shard)}
            yield self.scripts.publish_limits(shard, published)
        prefixes = [self.keys.prefix(n) for n in range(self.keys.shards)]
        yield self.scripts.publish_layout(
            self.keys.layout, namespace=self.keys.namespace, prefixes=prefixes
        )
        self._published_at = published_at

    def _shard_bounds(self, shard: ShardKeys) -> dict[str, int]:
        """What a shard's scripts apply beyond the configured limits, as the CLI needs it."""
        return {
            "shard": shard.shard,
            "shards": self.keys.shards,
            # the MAXLEN every event-writing call of this store passes for this shard
            "events_maxlen": self._events_maxlen,
            "page_limit_max": PAGE_LIMIT_MAX,
            "metadata_limit_max": METADATA_LIMIT_MAX,
            "events_count_max": EVENTS_COUNT_MAX,
        }

    # -- snapshots -------------------------------------------------------------------

    def export_batch(self, shard_no: int, after: str) -> Op[ExportReply]:
        """One batch of whole sessions of a shard, each read atomically."""
        reply: ExportReply = yield self.scripts.export_sessions(
            self.keys.shard(shard_no),
            self._now(),
            after=after,
            max_sessions=EXPORT_BATCH_SESSIONS,
            max_bytes=EXPORT_BATCH_BYTES,
        )
        return reply

    def restore_session(self, session: SnapshotSession, age_ms: int) -> Op[bool]:
        """Write one validated snapshot session unless the key is live. True if written."""
        keys, shard = self.keys.session(session.avatar_uuid, Channel(session.channel))

        def entries(records: list[Any]) -> list[str]:
            sid = session.session_id
            return [record_to_entry(r.seq, r.at_ms, sid, r.record.model_dump()) for r in records]

        restored: bool = yield self.scripts.restore_session(
            keys,
            shard,
            self._now(),
            session_id=session.session_id,
            created_ms=session.created_at_ms,
            active_ms=session.last_active_at_ms,
            age_ms=age_ms,
            summary=session.summary,
            max_events=self._events_maxlen,
            limits=self._limits_packet,
            receipts=session.receipts,
            entries=entries(session.records),
            archive=[entries(segment) for segment in session.archive],
        )
        return restored

    def publish(
        self,
        reason: ReasonCode,
        detail: dict[str, str | int],
        *,
        session_id: str = "",
        member: str = "",
    ) -> Op[str]:
        """An event no script publishes on its own (snapshots, permissions)."""
        shard_no = self.keys.shard_of(member.split(":", maxsplit=1)[0]) if member else 0
        shard = self.keys.shard(shard_no)
        event_id: str = yield self.scripts.publish_event(
            shard,
            now_wall=self._now().wall,
            reason=reason.value,
            max_events=self._events_maxlen,
            session_id=session_id,
            member=member,
            detail=detail,
        )
        return event_id

    def restore_marker(self, generation: int | None) -> Op[str]:
        """The generation this server's data was restored from ('' if none); set it if given."""
        before: str = yield self.scripts.mark_restored(self.keys.shard(0), generation=generation)
        return before

    def _parse_event_cursor(self, after: object) -> list[str]:
        if after is None:
            return [""] * self.keys.shards
        text = plain_str(after)
        if text is None:
            raise InvalidInput("after", "must be None or an event id as returned by events()")
        parts = text.split(",")
        if len(parts) != self.keys.shards:
            raise InvalidInput("after", "must be None or an event id as returned by events()")
        return [stream_id(p, "after") if p else "" for p in parts]


class _Turn(NamedTuple):
    """A record_turn call ready to send, and the session it writes."""

    call: ScriptCall[RecordReply]
    session: SessionKeys
    shard: ShardKeys
    channel: Channel
    now: ClockReading


def _context(
    reply: ContextReply, budget: int | None, count: Callable[[str], int]
) -> list[ContextMessage]:
    """context()'s messages from its read: none for no live session; with a token
    budget, the newest part that fits (gridmem/budget.py)."""
    if not reply.session_id:
        return []
    messages = context_messages(reply.summary, reply.entries, reply.session_id)
    if budget is None:
        return messages
    return fit(messages, bool(reply.summary), budget, count)


def _stored(reply: RecordReply) -> Receipt | None:
    """The receipt of a record into a required session; None where it had ended."""
    return _receipt(reply, duplicate=reply.duplicate) if reply.session_id else None


def _receipt(reply: RecordReply, *, duplicate: bool = False) -> Receipt:
    """The receipt of a parsed reply, validated from a dict: pydantic-core checks the
    six fields in about 1.4 us where model_construct's Python loop over them takes
    about 3.7 us (and model_construct checks nothing)."""
    return Receipt.model_validate(
        {
            "session_id": reply.session_id,
            "seq": reply.seq,
            "new_session": reply.new_session,
            "redactions": reply.redactions,
            "truncated": reply.truncated,
            "duplicate": duplicate,
        }
    )


def _metadata(row: MetaRow) -> SessionMetadata:
    uuid, channel = row.member.split(":")
    return SessionMetadata(
        session_id=row.session_id,
        avatar_uuid=uuid,
        channel=Channel(channel),
        created_at_ms=row.created_ms,
        last_active_at_ms=row.active_ms,
        turn_count=row.turns,
        byte_count=row.bytes,
    )


_EVENT_FIELDS = ("reason", "at", "sid", "uuid", "ch")


def _event(event_id: str, fields: dict[str, str]) -> Event:
    detail: dict[str, int | str] = {
        k: int(v) if v.lstrip("-").isdigit() else v
        for k, v in fields.items()
        if k not in _EVENT_FIELDS
    }
    channel = fields.get("ch") or None
    return Event(
        id=event_id,
        reason=ReasonCode(fields["reason"]),
        at_ms=int(fields["at"]),
        session_id=fields.get("sid", ""),
        avatar_uuid=fields.get("uuid", ""),
        channel=Channel(channel) if channel else None,
        detail=detail,
    )
