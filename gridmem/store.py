"""ConversationStore: the only door to conversation data.

Callers hand it records; it validates, bounds and encodes them (gridmem/codec.py),
then runs one atomic Lua script per change. Reads come back the same way, except
context(), which is one MULTI/EXEC of plain reads (gridmem/reads.py). The
behaviour lives in gridmem/operations.py, shared with AsyncConversationStore;
each door only drives it, through its executor (gridmem/executor.py), the only
code that sends commands.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from typing import Generic
from typing import NamedTuple
from typing import Protocol
from typing import TypeVar
from typing import cast

import redis
import redis.asyncio as redis_async
import redis.asyncio.cluster as async_cluster
import redis.cluster
from pydantic import BaseModel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from gridmem import backlog
from gridmem.budget import TokenCounter
from gridmem.clock import Clock
from gridmem.clock import SystemClock
from gridmem.config import ConversationConfig
from gridmem.config import Durability
from gridmem.config import RedisSettings
from gridmem.config import Settings
from gridmem.embedded import SharedValkey
from gridmem.errors import StoreClosed
from gridmem.executor import AsyncClient
from gridmem.executor import AsyncExecutor
from gridmem.executor import Executor
from gridmem.executor import Pending
from gridmem.executor import SyncClient
from gridmem.keys import KeySpace
from gridmem.keys import ServiceKeys
from gridmem.operations import Op
from gridmem.operations import Operations
from gridmem.records import ContextMessage
from gridmem.records import Event
from gridmem.records import MetadataPage
from gridmem.records import ReasonCode
from gridmem.records import Receipt
from gridmem.records import Record
from gridmem.records import StoreStats
from gridmem.records import TurnPage
from gridmem.records import TurnView
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.replies import AnyCall
from gridmem.replies import ExportReply
from gridmem.replies import ScriptCall
from gridmem.scripts import Scripts
from gridmem.snapshots import QuarantinedGeneration
from gridmem.snapshots import RestoreReport
from gridmem.snapshots import SkippedEntry
from gridmem.snapshots import SnapshotDirectory
from gridmem.snapshots import SnapshotInfo
from gridmem.snapshots import SnapshotInvalid
from gridmem.snapshots import ValidatedGeneration
from gridmem.snapshots import age_ms as snapshot_age_ms
from gridmem.snapshots import expired as snapshot_expired
from gridmem.snapshots import snapshot_line

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
# Where flush's export cursors meet: the middle of the member space ('<uuid>:
# <channel>', lexical order; avatar keys are random UUIDs). The first cursor
# exports members up to the first split, the next those after it, and so on.
# Two cursors took 0.35-0.47 s for 10,000 sessions where one took 0.53-0.66 s;
# four were no faster than two (docs/benchmarks.md, Snapshots).
EXPORT_SPLITS = ("7fffffff-ffff-ffff-ffff-ffffffffffff:public",)

log = logging.getLogger("gridmem.store")

# AsyncConversationStore prepares (redacts) a record with more text than this in a
# worker thread: redaction is linear, but a megabyte of match-dense text still
# takes a noticeable time, and on the event loop it would stall every other
# conversation of the process (measured on a 2-core VM: 1 MiB of "token: " held
# the loop 666 ms; in a thread the loop's longest gap was 32 ms). Below this size
# the stall is small (4 KiB of that text: 1.7 ms) and a thread hand-off not worth it.
OFFLOAD_TEXT_CHARS = 4096


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A client as gridmem wants it: redis-py's own retries off.

    redis-py retries every command on connection errors by default, which could
    apply a turn recorded without an idempotency key twice. gridmem retries only
    what is safe to resend (see gridmem/executor.py).
    """
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)


def connect_async(
    url: str, *, max_connections: int | None = None, **kwargs: Any
) -> redis_async.Redis:
    """connect() for asyncio: each worker process builds its own after it starts.

    With `max_connections`, a pool that makes a caller wait for a free connection
    instead of opening one more: a thousand conversations in flight then share a
    few dozen connections (a command takes well under a millisecond) rather than
    opening a thousand at once, which overflowed the server's listen backlog on a
    Unix socket (connect() fails at once there: "redis unreachable", issue 16).
    """
    retry = AsyncRetry(NoBackoff(), 0)
    if max_connections is None:
        return redis_async.Redis.from_url(url, retry=retry, **kwargs)
    pool = redis_async.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, retry=retry, **kwargs
    )
    return redis_async.Redis.from_pool(pool)  # the client owns it: aclose() closes it too


def connect_cluster(url: str, **kwargs: Any) -> redis.cluster.RedisCluster:
    """A Redis / Valkey Cluster client from the URL of any one node (it finds the
    others), redis-py's own retries off as in connect(): its retry of a command on
    a connection fault, after reading the slot map anew, could apply a turn twice."""
    return redis.cluster.RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)


def connect_cluster_async(url: str, **kwargs: Any) -> async_cluster.RedisCluster:
    """connect_cluster() for asyncio."""
    return async_cluster.RedisCluster.from_url(url, retry=AsyncRetry(NoBackoff(), 0), **kwargs)


def client_for(redis_settings: RedisSettings, url: str, **kwargs: Any) -> SyncClient:
    """The blocking client `[redis]` asks for at `url`: a cluster client with
    `cluster = true`, else a plain one."""
    if redis_settings.cluster:
        return connect_cluster(url, **kwargs)
    return connect(url, **kwargs)


def async_client_for(redis_settings: RedisSettings, url: str, **kwargs: Any) -> AsyncClient:
    """client_for() for asyncio (the worker service's processes)."""
    if redis_settings.cluster:
        kwargs.pop(
            "max_connections", None
        )  # per node, and redis-py's cluster pool raises when full
        return connect_cluster_async(url, **kwargs)
    return connect_async(url, **kwargs)


def _snapshot_dir(settings: Settings) -> Path:
    return settings.storage_path / "conversations"


def log_backlog_restored(restored: backlog.RestoreReport | None) -> None:
    """Counts only: what a stream backlog restore added, or why it refused the file."""
    if restored is None or not restored.found:
        return
    if restored.quarantined is not None:
        log.warning("stream backlog quarantined: %s; nothing of it added", restored.quarantined)
        return
    log.info(
        "stream backlog restored: %d inbound, %d outbound entries added, %d already there",
        restored.inbound,
        restored.outbound,
        restored.skipped,
    )
    if restored.renumbered:
        log.warning(
            "stream backlog: %d inbound entries added at new IDs (messages were posted "
            "before the restore); their replies name the new IDs in in_reply_to",
            restored.renumbered,
        )


def attach_private(settings: Settings, clock: Clock | None = None) -> SharedValkey:
    """Attach to the private Valkey of settings.storage_path, starting it if none runs.
    A server this call starts gets the newest snapshot (persistence on) before any
    other user can attach, so no one writes a session the snapshot holds first."""
    shared = SharedValkey(settings.storage_path / "valkey", settings)

    def restore() -> None:
        if not settings.conversation.persistence_enabled:
            return
        with open_store(settings, shared.url, clock=clock) as store:
            report = store.restore()
            if report.error is not None:
                log.error("restore: %s", report.error)
            try:
                restored = store.restore_backlog()
            except Exception as exc:  # the file stays for the next start
                log.error("restoring the stream backlog failed: %s", exc)
            else:
                log_backlog_restored(restored)

    shared.attach(on_start=restore)
    return shared


def open_store(
    settings: Settings, url: str, *, clock: Clock | None = None, **client: Any
) -> ConversationStore:
    """A blocking store over `url` as `settings` say: their conversation config, the
    snapshot directory under storage_path when persistence is on. The one factory:
    from_config, a new private server's restore, `gridmem serve`'s supervisor and
    the private server's last flush build their stores here. `client`: connect()'s
    keyword arguments (a socket_timeout)."""
    snapshot_dir = _snapshot_dir(settings) if settings.conversation.persistence_enabled else None
    return ConversationStore(
        client_for(settings.redis, url, **client),
        settings.conversation,
        clock=clock,
        snapshot_dir=snapshot_dir,
        durability=settings.redis.durability,
    )


class _Target(NamedTuple):
    """Where from_config connects: the URL, the private server it attached to (None
    with a Redis URL) and the snapshot directory (None with persistence off)."""

    url: str
    shared: SharedValkey | None
    snapshot_dir: Path | None


def _target(settings: Settings, clock: Clock | None) -> _Target:
    """What both doors' from_config connect to, so the two cannot drift."""
    persistence = settings.conversation.persistence_enabled
    snapshot_dir = _snapshot_dir(settings) if persistence else None
    if settings.redis.url is not None:
        return _Target(settings.redis.url, None, snapshot_dir)
    shared = attach_private(settings, clock)
    return _Target(shared.url, shared, snapshot_dir)


def _door_state(
    config: ConversationConfig | None, clock: Clock | None, snapshot_dir: str | Path | None
) -> tuple[ConversationConfig, Clock, Path | None, Operations]:
    """What either door holds besides its client and executor: the configuration, the
    clock, the snapshot directory, and the operations both drive (written once)."""
    config = config or ConversationConfig()
    clock = clock or SystemClock()
    directory = Path(snapshot_dir) if snapshot_dir is not None else None
    return config, clock, directory, Operations(config, clock)


class ConversationStore:
    """Bounded, isolated conversation memory over one Redis-compatible server or cluster.

    Pass a client from `connect(url)` (or `connect_cluster(url)` for a Redis / Valkey
    Cluster), or one you built with redis-py's retries off
    (`retry=Retry(NoBackoff(), 0)`): gridmem retries only what is safe to resend.
    Or use `from_config`.
    """

    def __init__(
        self,
        redis_client: SyncClient,
        config: ConversationConfig | None = None,
        *,
        clock: Clock | None = None,
        snapshot_dir: str | Path | None = None,
        durability: Durability = "none",
    ) -> None:
        self.redis = redis_client
        self.executor = Executor(redis_client, durability=durability)
        self.config, self.clock, self.snapshot_dir, self._ops = _door_state(
            config, clock, snapshot_dir
        )
        # Persistence is on when there is a place for it (DESIGN section 10).
        self.snapshots: SnapshotDirectory | None = None
        if self.snapshot_dir is not None:
            self.snapshots = SnapshotDirectory(
                self.snapshot_dir, self.config.limits, DEFAULT_REDACTOR
            )
        self._permissions_reported = False
        self._shared: SharedValkey | None = None  # from_config's private server

    @classmethod
    def from_config(cls, settings: Settings, *, clock: Clock | None = None) -> ConversationStore:
        """Connect as `settings` say. With no Redis URL: the private Valkey under
        storage_path, shared with every local process of that storage_path (started
        if none runs; it stops when the last of them closes or exits). Close the
        store (or use it in a `with` block) to leave it."""
        target = _target(settings, clock)
        store = open_store(settings, target.url, clock=clock)
        store._shared = target.shared
        return store

    # -- the API (DESIGN section 9) -------------------------------------------------

    def record(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Store one record in the (avatar, channel) session; a new session if it expired."""
        return self._drive(self._ops.record(avatar_uuid, channel, record, idempotency_key))

    def context(
        self,
        avatar_uuid: str,
        channel: str,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
    ) -> list[ContextMessage]:
        """The LLM-facing view of one session: user/assistant messages only. Not activity.

        With `max_tokens`: the newest turns that fit, the summary in front if it fits
        too, counted by `count_tokens` (default: UTF-8 bytes, gridmem/budget.py)."""
        return self._drive(self._ops.context(avatar_uuid, channel, max_tokens, count_tokens))

    def record_and_context(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        idempotency_key: str | None = None,
        *,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
    ) -> tuple[Receipt, list[ContextMessage]]:
        """record(), then context() as the session stands right after it: one atomic
        MULTI/EXEC, one round trip instead of two (what an agent does with each new
        message: store it, then ask the model)."""
        op = self._ops.record_and_context(
            avatar_uuid,
            channel,
            record,
            idempotency_key,
            max_tokens=max_tokens,
            count_tokens=count_tokens,
        )
        return self._drive(op)

    def record_in_session(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        session_id: str,
        idempotency_key: str | None = None,
    ) -> Receipt | None:
        """record(), only into the live session `session_id` (a Receipt's); None, and
        nothing stored, if that session has ended (expired, deleted, evicted): an
        answer goes into the session whose context it answers, never into the next."""
        op = self._ops.record_in_session(avatar_uuid, channel, record, session_id, idempotency_key)
        return self._drive(op)

    def record_in_session_then(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        session_id: str,
        idempotency_key: str | None,
        *,
        then: ScriptCall[T],
    ) -> tuple[Receipt | None, T]:
        """record_in_session(), then `then` (a call of the worker service's, from
        gridmem.scripts) in the same MULTI/EXEC where both lie in one slot (any single
        server), else right after it: the service's reply and its entry's finish."""
        op = self._ops.record_in_session_then(
            avatar_uuid, channel, record, session_id, idempotency_key, then=then
        )
        return self._drive(op)

    def check_record(self, record: Record | dict[str, Any]) -> None:
        """Raise what record() would raise for this record itself (InvalidRecord,
        InputTooLarge, a credential-looking tool or action name), sending nothing: to
        refuse a batch whole before its first record is stored."""
        self._ops.check_record(record)

    def list_metadata(self, cursor: str | None = None, limit: int = 100) -> MetadataPage:
        """One page of session metadata (never content); next_cursor is None at the end."""
        return self._drive(self._ops.list_metadata(cursor, limit))

    def read_page(
        self,
        avatar_uuid: str,
        channel: str,
        anchor: int | None = None,
        direction: str = "backward",
        limit: int = 50,
    ) -> TurnPage:
        """One chronological transcript page for operators; never used for LLM context."""
        return self._drive(self._ops.read_page(avatar_uuid, channel, anchor, direction, limit))

    def delete(self, avatar_uuid: str, channel: str) -> bool:
        """Operator deletion: remove the session whole. True if there was one."""
        return self._drive(self._ops.end_session(avatar_uuid, channel, ReasonCode.DELETED_OPERATOR))

    def expire(self, avatar_uuid: str, channel: str) -> bool:
        """Operator expiry: end the session now; the next turn starts a new one."""
        return self._drive(self._ops.end_session(avatar_uuid, channel, ReasonCode.EXPIRED_OPERATOR))

    def pop_newest(self, avatar_uuid: str, channel: str) -> TurnView | None:
        """Remove the session's newest live record, atomically; None if it holds none.

        Its bytes, turn and receipt go with it (event popped_newest); the last record
        takes the session whole. Not activity. Behind the OpenAI Agents SDK's
        `Session.pop_item` (gridmem/integrations/openai_agents.py)."""
        return self._drive(self._ops.pop_newest(avatar_uuid, channel))

    def sweep(self, limit: int = 1000) -> int:
        """Expire up to `limit` idle sessions, in bounded batches. Returns how many.

        Every record() already expires a few idle sessions of its shard; call this
        on a timer to free memory when writes stop or are rare (`gridmem serve`
        does, every sweep_interval_seconds)."""
        return self._drive(self._ops.sweep(limit))

    def events(self, after: str | None = None, count: int = 100) -> list[Event]:
        """Events oldest first; pass the last Event.id seen as `after` to follow the stream."""
        return self._drive(self._ops.events(after, count))

    def receipt(self, avatar_uuid: str, channel: str, idempotency_key: str) -> Receipt | None:
        """The receipt of a recorded idempotency key in the live session, or None."""
        return self._drive(self._ops.receipt(avatar_uuid, channel, idempotency_key))

    def stats(self) -> StoreStats:
        """Sessions per channel, stored bytes, redactions and events by reason. Counts only."""
        return self._drive(self._ops.stats())

    def publish_limits(self) -> None:
        """Publish layout and limits for bin/gridmem-cli (also done before a first write)."""
        self._drive(self._ops.publish_limits())

    def flush(self) -> SnapshotInfo | None:
        """Write every live session to a new snapshot generation; None when persistence is off.

        Raises SnapshotError (a GridmemError) if the generation cannot be written;
        the previous generations are then untouched.
        """
        if self.snapshots is None:
            return None
        with self.snapshots.locked():
            self._report_permissions()
            return self.snapshots.write(
                self._snapshot_lines(),
                created_ms=self.clock.wall_ms(),
                boot_id=self.clock.boot_id(),
            )

    def restore(self) -> RestoreReport:
        """Load the newest valid generation, once per server lifetime. Never raises.

        Each generation is checked whole before anything reaches Redis; a failing
        one goes to quarantine (event snapshot_quarantined) and the next older one
        is tried. Live sessions are never overwritten; sessions past their TTL by
        wall-clock age are not restored (event expired_inactivity).
        """
        report = RestoreReport()
        if self.snapshots is None:
            return report
        try:
            with self.snapshots.locked():
                self._report_permissions()
                if self._drive(self._ops.restore_marker(None)):
                    return report  # this server's data was restored already (another process?)
                report.ran = True
                self._restore_newest_valid(self.snapshots, report)
                self._drive(self._ops.restore_marker(report.generation or 0))
        except Exception as exc:  # start-up must go on: say what happened instead
            report.error = f"{type(exc).__name__}: {exc}"
        return report

    def save_backlog(self) -> backlog.SaveReport | None:
        """Write the service streams' backlog (unanswered inbound entries, the newest
        replies) to `<snapshot dir>/backlog`, redacted and signed; None when
        persistence is off. For a server that keeps its streams in memory (the
        private Valkey): see gridmem/backlog.py. Raises SnapshotError or a redis error."""
        if self.executor.closed:
            raise StoreClosed
        if self.snapshots is None:
            return None
        return backlog.save(
            self.executor, self.snapshots, self._service_keys(), created_ms=self.clock.wall_ms()
        )

    def restore_backlog(self) -> backlog.RestoreReport | None:
        """Add a saved backlog's entries at their IDs (none the streams already hold),
        then delete the file; a file failing a check goes to quarantine. Before the
        consumer group is created. None when persistence is off."""
        if self.executor.closed:
            raise StoreClosed
        if self.snapshots is None:
            return None
        return backlog.restore(
            self.executor,
            self.snapshots,
            self._service_keys(),
            max_value_bytes=self.config.limits.max_input_bytes,
            now_ms=self.clock.wall_ms(),
        )

    def _service_keys(self) -> tuple[ServiceKeys, ...]:
        """The worker service's streams, every partition's (docs/streams.md)."""
        config = self.config
        return KeySpace(config.namespace, config.shards, config.partitions).services()

    @property
    def scripts(self) -> Scripts:
        return self._ops.scripts

    def stored_text(self, text: str) -> str:
        """What record() would keep of an agent reply: cleaned, redacted, bounded."""
        return self._ops.prepare.text(text, "text", self.config.limits.max_text_bytes)[0]

    def close(self) -> None:
        """Close the client; leave the private server (the last user out stops it).
        Any call after this raises StoreClosed; closing again does nothing."""
        self.executor.close()
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.detach()

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- snapshots -------------------------------------------------------------------

    def _snapshot_lines(self) -> Iterator[bytes]:
        """Every live session as one snapshot line, shard by shard, in bounded batches.

        Two cursors walk each shard's members, one up to EXPORT_SPLITS[0] and one
        after it. A cursor sends its next call as soon as it has read its last reply,
        before that batch becomes lines (`_start`: sent now, read later, in this
        thread): the server reads the next batches while lines are built and
        written, and has the other cursor's call to run while a reply is on its
        way. Two calls at most are in flight; each is as short as before. One thread:
        helper threads made every reply wait for the GIL the line building held,
        and the next call with it (docs/benchmarks.md, Snapshots)."""
        cursors: deque[tuple[Started[ExportReply], str | None]] = deque()
        try:
            for shard in self._ops.keys.all_shards():
                # (the next batch, the last member this cursor exports; None: to the end)
                bounds = ["", *EXPORT_SPLITS]
                ends: list[str | None] = [*EXPORT_SPLITS, None]
                for after, last in zip(bounds, ends, strict=True):
                    cursors.append((self._start(self._ops.export_batch(shard.shard, after)), last))
                while cursors:
                    pending, last = cursors.popleft()
                    batch = pending.result()
                    if batch.next_after and (last is None or batch.next_after < last):
                        ask = self._ops.export_batch(shard.shard, batch.next_after)
                        cursors.append((self._start(ask), last))
                    for session in batch.sessions:
                        if last is None or session.member <= last:  # after it: the other's
                            yield snapshot_line(session)
        finally:
            for pending, _ in cursors:  # a flush that failed: replies never to be read
                pending.cancel()

    def _restore_newest_valid(self, snapshots: SnapshotDirectory, report: RestoreReport) -> None:
        generations, report.skipped = snapshots.scan()
        for generation, path in reversed(generations):
            try:
                valid = snapshots.validate(generation, path)
            except SnapshotInvalid as bad:
                if not snapshots.quarantine(path):  # left in place; older ones still tried
                    unmoved = SkippedEntry(name=path.name, reason="quarantine_unusable")
                    report.skipped.append(unmoved)
                report.quarantined.append(
                    QuarantinedGeneration(generation=generation, cause=bad.cause)
                )
                detail: dict[str, str | int] = {"generation": generation, "cause": bad.cause}
                self._drive(self._ops.publish(ReasonCode.SNAPSHOT_QUARANTINED, detail))
                continue
            except OSError:
                report.unreadable.append(generation)
                continue
            self._restore_generation(snapshots, valid, report)
            return

    def _restore_generation(
        self, snapshots: SnapshotDirectory, valid: ValidatedGeneration, report: RestoreReport
    ) -> None:
        """Oldest activity first, so eviction (if limits were lowered) keeps the newest."""
        now = self.clock.wall_ms()
        for _, offset, length, digest in valid.lines:
            session = snapshots.read_session(valid, offset, length, digest)
            age = snapshot_age_ms(session.last_active_at_ms, now)
            if snapshot_expired(session, now):
                report.sessions_expired += 1
                counts: dict[str, str | int] = {"turns": len(session.records), "age_ms": age}
                self._drive(
                    self._ops.publish(
                        ReasonCode.EXPIRED_INACTIVITY,
                        counts,
                        session_id=session.session_id,
                        member=session.member,
                    )
                )
            elif self._drive(self._ops.restore_session(session, age)):
                report.sessions_restored += 1
            else:
                report.sessions_live += 1
        report.generation = valid.generation
        detail: dict[str, str | int] = {
            "generation": valid.generation,
            "restored": report.sessions_restored,
            "live": report.sessions_live,
            "expired": report.sessions_expired,
        }
        self._drive(self._ops.publish(ReasonCode.SNAPSHOT_RESTORED, detail))

    def _report_permissions(self) -> None:
        """Where file modes cannot be forced, say so once: operators must restrict the ACL."""
        if self.snapshots is None or self.snapshots.posix or self._permissions_reported:
            return
        self._permissions_reported = True
        detail: dict[str, str | int] = {"directory": "snapshots"}
        self._drive(self._ops.publish(ReasonCode.PERMISSIONS_NOT_VERIFIED, detail))

    # -- driving the shared operations ----------------------------------------------

    def _drive(self, op: Op[T]) -> T:
        try:
            call = next(op)  # validation runs here, before any command
        except StopIteration as done:
            result: T = done.value
            return result
        return self._drive_from(op, call)

    def _start(self, op: Op[T]) -> Started[T]:
        """Run an operation whose first call is a script call, that call sent now and
        its reply read by result() (Executor.submit); the rest as _drive runs it."""
        try:
            call = next(op)  # validation runs here, before any command
        except StopIteration as done:
            return _Finished(done.value)
        if not isinstance(call, ScriptCall):
            return _Finished(self._drive_from(op, call))
        return _Resumed(self, op, self.executor.submit(call))

    def _drive_from(self, op: Op[T], call: AnyCall) -> T:
        """_drive, from a call the operation already yielded."""
        run = self.executor.call
        try:
            while True:
                call = op.send(run(call))
        except StopIteration as done:
            result: T = done.value
            return result


class AsyncConversationStore:
    """The same store as coroutines over `redis.asyncio`, for the worker service.

    It drives the very same operations (gridmem/operations.py) as
    ConversationStore: keys, scripts, validation, redaction, encoding and
    decoding exist once. Snapshots (`flush`, `restore`) are file work: they run
    ConversationStore's own code in a worker thread, its Redis calls on this
    store's event loop.
    """

    def __init__(
        self,
        redis_client: AsyncClient,
        config: ConversationConfig | None = None,
        *,
        clock: Clock | None = None,
        snapshot_dir: str | Path | None = None,
        durability: Durability = "none",
    ) -> None:
        self.redis = redis_client
        self.executor = AsyncExecutor(redis_client, durability=durability)
        self.config, self.clock, self.snapshot_dir, self._ops = _door_state(
            config, clock, snapshot_dir
        )
        self._files = _LoopDrivenFiles(self)
        self._shared: SharedValkey | None = None  # from_config's private server

    @classmethod
    def from_config(
        cls, settings: Settings, *, clock: Clock | None = None
    ) -> AsyncConversationStore:
        """As ConversationStore.from_config (the private server shared, a new one
        restored from the newest snapshot); leave it with `aclose()` or `async with`.
        It blocks while a server starts (well under a second): call it at start-up."""
        target = _target(settings, clock)
        store = cls(
            async_client_for(settings.redis, target.url),
            settings.conversation,
            clock=clock,
            snapshot_dir=target.snapshot_dir,
            durability=settings.redis.durability,
        )
        store._shared = target.shared
        return store

    async def record(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        idempotency_key: str | None = None,
    ) -> Receipt:
        return await self._drive(
            self._ops.record(avatar_uuid, channel, record, idempotency_key),
            offload=_text_chars(record) > OFFLOAD_TEXT_CHARS,
        )

    async def context(
        self,
        avatar_uuid: str,
        channel: str,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
    ) -> list[ContextMessage]:
        return await self._drive(self._ops.context(avatar_uuid, channel, max_tokens, count_tokens))

    async def check_record(self, record: Record | dict[str, Any]) -> None:
        if _text_chars(record) > OFFLOAD_TEXT_CHARS:  # redaction off the event loop
            await asyncio.to_thread(self._ops.check_record, record)
        else:
            self._ops.check_record(record)

    async def record_in_session(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        session_id: str,
        idempotency_key: str | None = None,
    ) -> Receipt | None:
        op = self._ops.record_in_session(avatar_uuid, channel, record, session_id, idempotency_key)
        return await self._drive(op, offload=_text_chars(record) > OFFLOAD_TEXT_CHARS)

    async def record_in_session_then(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        session_id: str,
        idempotency_key: str | None,
        *,
        then: ScriptCall[T],
    ) -> tuple[Receipt | None, T]:
        op = self._ops.record_in_session_then(
            avatar_uuid, channel, record, session_id, idempotency_key, then=then
        )
        return await self._drive(op, offload=_text_chars(record) > OFFLOAD_TEXT_CHARS)

    async def record_and_context(
        self,
        avatar_uuid: str,
        channel: str,
        record: Record | dict[str, Any],
        idempotency_key: str | None = None,
        *,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
    ) -> tuple[Receipt, list[ContextMessage]]:
        op = self._ops.record_and_context(
            avatar_uuid,
            channel,
            record,
            idempotency_key,
            max_tokens=max_tokens,
            count_tokens=count_tokens,
        )
        return await self._drive(op, offload=_text_chars(record) > OFFLOAD_TEXT_CHARS)

    async def list_metadata(self, cursor: str | None = None, limit: int = 100) -> MetadataPage:
        return await self._drive(self._ops.list_metadata(cursor, limit))

    async def read_page(
        self,
        avatar_uuid: str,
        channel: str,
        anchor: int | None = None,
        direction: str = "backward",
        limit: int = 50,
    ) -> TurnPage:
        return await self._drive(
            self._ops.read_page(avatar_uuid, channel, anchor, direction, limit)
        )

    async def delete(self, avatar_uuid: str, channel: str) -> bool:
        return await self._drive(
            self._ops.end_session(avatar_uuid, channel, ReasonCode.DELETED_OPERATOR)
        )

    async def expire(self, avatar_uuid: str, channel: str) -> bool:
        return await self._drive(
            self._ops.end_session(avatar_uuid, channel, ReasonCode.EXPIRED_OPERATOR)
        )

    async def pop_newest(self, avatar_uuid: str, channel: str) -> TurnView | None:
        return await self._drive(self._ops.pop_newest(avatar_uuid, channel))

    async def sweep(self, limit: int = 1000) -> int:
        return await self._drive(self._ops.sweep(limit))

    async def events(self, after: str | None = None, count: int = 100) -> list[Event]:
        return await self._drive(self._ops.events(after, count))

    async def receipt(self, avatar_uuid: str, channel: str, idempotency_key: str) -> Receipt | None:
        return await self._drive(self._ops.receipt(avatar_uuid, channel, idempotency_key))

    async def stats(self) -> StoreStats:
        return await self._drive(self._ops.stats())

    async def publish_limits(self) -> None:
        """Publish layout and limits for bin/gridmem-cli (also done before a first write)."""
        await self._drive(self._ops.publish_limits())

    @property
    def snapshots(self) -> SnapshotDirectory | None:
        """The snapshot directory; None when persistence is off (no snapshot_dir)."""
        return self._files.snapshots

    async def flush(self) -> SnapshotInfo | None:
        """As ConversationStore.flush: a new snapshot generation; None when persistence is off."""
        return await self._files.in_thread(ConversationStore.flush)

    async def restore(self) -> RestoreReport:
        """As ConversationStore.restore: the newest valid generation, once. Never raises."""
        return await self._files.in_thread(ConversationStore.restore)

    async def save_backlog(self) -> backlog.SaveReport | None:
        """As ConversationStore.save_backlog."""
        return await self._files.in_thread(ConversationStore.save_backlog)

    async def restore_backlog(self) -> backlog.RestoreReport | None:
        """As ConversationStore.restore_backlog."""
        return await self._files.in_thread(ConversationStore.restore_backlog)

    @property
    def scripts(self) -> Scripts:
        return self._ops.scripts

    async def stored_text(self, text: str) -> str:
        """What record() would keep of an agent reply: cleaned, redacted, bounded."""
        limit = self.config.limits.max_text_bytes
        if len(text) > OFFLOAD_TEXT_CHARS:  # off the event loop, as record() does
            prepared = await asyncio.to_thread(self._ops.prepare.text, text, "text", limit)
        else:
            prepared = self._ops.prepare.text(text, "text", limit)
        return prepared[0]

    async def aclose(self) -> None:
        """Close the client; leave the private server (the last user out stops it).
        Any call after this raises StoreClosed; closing again does nothing."""
        await self.executor.aclose()
        shared, self._shared = self._shared, None
        if shared is not None:
            await asyncio.to_thread(shared.detach)

    async def __aenter__(self) -> AsyncConversationStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _drive(self, op: Op[T], *, offload: bool = False) -> T:
        """Run an operation. With `offload`, its first step (validation and preparation:
        everything before the first command) runs in a worker thread."""
        try:
            if offload:
                first = await asyncio.to_thread(_first_step, op)
                if isinstance(first, _Done):
                    result: T = first.value
                    return result
                call = first
            else:
                call = next(op)  # validation runs here, before any command
            while True:
                call = op.send(await self.executor.call(call))
        except StopIteration as done:
            result = done.value
            return result


class _LoopDrivenFiles(ConversationStore):
    """ConversationStore's snapshot code for AsyncConversationStore, written once.

    Its methods run in a worker thread (file reads, writes and fsyncs would stall
    the event loop); each operation they drive is handed back to the async
    store's loop, which is free meanwhile: it is awaiting the thread.
    """

    def __init__(self, door: AsyncConversationStore) -> None:  # no client of its own
        self.config = door.config
        self.clock = door.clock
        self.snapshot_dir = door.snapshot_dir
        self._ops = door._ops
        self.snapshots = None
        if door.snapshot_dir is not None:
            self.snapshots = SnapshotDirectory(
                door.snapshot_dir, door.config.limits, DEFAULT_REDACTOR
            )
        self._permissions_reported = False
        self._door = door
        self._loop: asyncio.AbstractEventLoop | None = None
        self.executor = cast(Executor, _LoopDrivenCommands(self))

    async def in_thread(self, method: Callable[[ConversationStore], T]) -> T:
        self._loop = asyncio.get_running_loop()
        return await asyncio.to_thread(method, self)

    def _drive(self, op: Op[T]) -> T:
        assert self._loop is not None, "only called from in_thread"
        return asyncio.run_coroutine_threadsafe(self._door._drive(op), self._loop).result()

    def _start(self, op: Op[T]) -> Started[T]:
        """The operation runs on the loop now; result() waits for it."""
        assert self._loop is not None, "only called from in_thread"
        return asyncio.run_coroutine_threadsafe(self._door._drive(op), self._loop)


class _LoopDrivenCommands:
    """The plain commands of the backlog code (an Executor's `command`), sent by the
    async door's executor on its loop while the file code runs in a worker thread."""

    def __init__(self, files: _LoopDrivenFiles) -> None:
        self._files = files

    @property
    def closed(self) -> bool:
        return self._files._door.executor.closed

    def command(self, *args: Any) -> Any:
        loop = self._files._loop
        assert loop is not None, "only called from in_thread"
        coroutine = self._files._door.executor.command(*args)
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


class Started(Protocol[T_co]):
    """An operation under way (ConversationStore._start): its result, or cancel()
    when it will never be asked for."""

    def result(self) -> T_co: ...

    def cancel(self) -> Any: ...


class _Finished(Generic[T]):
    """An operation that ran whole at once."""

    def __init__(self, value: T) -> None:
        self._value = value

    def result(self) -> T:
        return self._value

    def cancel(self) -> None:
        pass


class _Resumed(Generic[T]):
    """An operation waiting for the reply of its first call (Executor.submit)."""

    def __init__(self, store: ConversationStore, op: Op[T], pending: Pending[Any]) -> None:
        self._store, self._op, self._pending = store, op, pending

    def result(self) -> T:
        op = self._op
        try:
            call = op.send(self._pending.result())
        except StopIteration as done:
            value: T = done.value
            return value
        return self._store._drive_from(op, call)

    def cancel(self) -> None:
        self._pending.cancel()
        self._op.close()


class _Done(NamedTuple):
    """An operation that returned before its first command."""

    value: Any


def _first_step(op: Op[Any]) -> AnyCall | _Done:
    """next(op) for asyncio.to_thread: StopIteration cannot cross into a future."""
    try:
        return next(op)
    except StopIteration as done:
        return _Done(done.value)


def _text_chars(record: object) -> int:
    """Characters of free text in a record (or its dict form): the redaction work it needs."""
    fields: Any = record.__dict__ if isinstance(record, BaseModel) else record
    if not isinstance(fields, dict):
        return 0
    return sum(len(value) for value in fields.values() if isinstance(value, str))
