"""The executors: the only code that sends commands to Redis (tests/test_executor.py).

One per I/O style, `Executor` over a blocking redis-py client and `AsyncExecutor`
over `redis.asyncio`, with the same ways to send:

- `call(ScriptCall)`: FCALL of one library function, loading gridmem's function
  library first if the server lacks it (FUNCTION LOAD, then the FCALL once more);
  a connection fault is retried with backoff only if the call is idempotent; a
  GM_* error becomes its exception class.
- `call(ReadCall)`: the read's commands in one MULTI/EXEC, retried on a
  connection fault (a read writes nothing); a full server (OOM) refuses MULTI, so
  the read's read-only script fallback runs instead, or else its reads one by one.
- `call(CommandCall)`: a plain command (several: in one MULTI/EXEC), retried on a
  connection fault only if the call is idempotent (an XADD is not).
- `call(Chained)`: MULTI, the write's FCALL, then the reads or the second FCALL,
  EXEC, in one write on one connection (of the slot's primary); both parsed, as a
  pair. The library is loaded where it is missing and the whole resent; a
  connection fault is retried only if both calls are idempotent; a full server
  (OOM) refuses it whole (OutOfMemoryError), as it refuses the write alone. On a
  cluster where the second call lies in another slot, the two are sent one after
  the other, the write first.
- `transaction(commands)`: EXEC's replies, without parsing (tests compare them).
- `submit(ScriptCall)` (blocking executor only): an idempotent read's FCALL written
  now on a pooled connection, its reply read later (`Pending.result`), so one thread
  works while the server runs it (flush's export batches); run whole at once where
  it cannot be split so (a cluster, a single-connection client, a write).
- `command(*args)`: one plain command, sent once (the service's blocking XREAD,
  the HSET of a rejected entry's reason); a blocking read that a failover ended
  early raises `Unblocked`.

The replies of MULTI/EXEC differ by executor: the sync one reads them raw (its
own MULTI/EXEC), the async one through redis-py's pipeline, which applies its
reply callbacks (HGETALL as a dict); a call's parse takes both.

Either executor takes a plain client or a cluster client (`redis.cluster.RedisCluster`,
`redis.asyncio.cluster.RedisCluster`; `connect_cluster` in gridmem/store.py). On a
cluster, every call goes to the primary owning its slot, found here, never by
redis-py (docs/scaling.md):

- an FCALL goes to the primary of its first key's slot (all its keys share the
  shard's hash tag), named as the target node: redis-py would otherwise ask the
  server for the keys of every FCALL (COMMAND GETKEYS, a round trip each). A
  MOVED or ASK reply is followed by redis-py (the server ran nothing), and the
  function library is loaded on the node that lacks it, whichever it is now (a
  new primary, a replica promoted after a failover).
- a MULTI/EXEC (a ReadCall, a CommandCall of several commands) runs on the
  connection pool of the primary owning its first command's key (the argument
  after the command name, or after its subcommand: XGROUP CREATE <key>);
  a MOVED or ASK reply there refreshes the slot map and is raised as `Rerouted`.
- a lone plain command (a CommandCall of one, `command`) is routed by redis-py.

Faults of a cluster in a failover (a node down, CLUSTERDOWN, a slot not covered,
`Rerouted`) are connection faults: retried with backoff for idempotent calls and
reads, raised to the caller for the others, like a single node's.

The store doors (gridmem/store.py), the service's inbound queue and the
supervisor (worker/) and snapshots (driven by the doors) all send through here.
A closed executor refuses every call with StoreClosed before a command is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import Generic
from typing import TypeVar
from typing import overload

import hiredis
import redis
import redis.asyncio as redis_async
import redis.asyncio.cluster as async_cluster
import redis.cluster
import tenacity
from redis.crc import key_slot
from redis.exceptions import AskError
from redis.exceptions import ClusterDownError
from redis.exceptions import MasterDownError
from redis.exceptions import MovedError
from redis.exceptions import RedisClusterException
from redis.exceptions import SlotNotCoveredError

from gridmem.config import Durability
from gridmem.errors import DurabilityTimeout
from gridmem.errors import StoreClosed
from gridmem.errors import script_error_from_reply
from gridmem.replies import Chained
from gridmem.replies import CommandCall
from gridmem.replies import ReadCall
from gridmem.replies import ScriptCall

T = TypeVar("T")
U = TypeVar("U")

Commands = tuple[tuple[Any, ...], ...]


class Rerouted(redis.ConnectionError):
    """A transaction sent to a node that no longer owns its slot (MOVED or ASK: the
    server ran none of it). The slot map is refreshed; resending goes to the owner."""


class Unblocked(redis.ConnectionError):
    """A blocking command (XREAD BLOCK) the server ended early because its role changed:
    a failover made the primary a replica ("UNBLOCKED ... instance state changed").
    Nothing was read; asking again reaches the new primary."""


def unblocked(exc: redis.ResponseError) -> redis.ResponseError | Unblocked:
    """The error a plain command's error reply stands for (Unblocked, or itself)."""
    return Unblocked(str(exc)) if str(exc).startswith("UNBLOCKED") else exc


# Connection faults of idempotent calls are retried with backoff; nothing else is. On a
# cluster, so are the faults of a failover: the slot's primary is down, or not yet
# replaced (CLUSTERDOWN, MASTERDOWN, a slot no node covers), or it moved (Rerouted).
RETRYABLE = (
    DurabilityTimeout,
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    MasterDownError,
    SlotNotCoveredError,
)

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis_async.Redis | async_cluster.RedisCluster

_MULTI = hiredis.pack_command(("MULTI",))
_EXEC = hiredis.pack_command(("EXEC",))

# `durability = "replica"`: how long a state change waits for one replica (WAIT 1 <ms>).
DURABILITY_WAIT_MS = 1_000
# Plain commands that change nothing: a command call made of these alone waits for no
# replica (every other command call, and every script without the no-writes flag, does).
READ_COMMANDS = frozenset({"XRANGE", "GET", "XLEN", "HGETALL", "ZCARD"})


def writes(call: ScriptCall[Any] | CommandCall[Any]) -> bool:
    """Whether a call may change state (what `durability = "replica"` waits for)."""
    if isinstance(call, ScriptCall):
        return "no-writes" not in call.script.flags
    return any(str(command[0]).upper() not in READ_COMMANDS for command in call.commands)


def durable_commands(
    call: ScriptCall[Any] | CommandCall[Any], wait_ms: int = DURABILITY_WAIT_MS
) -> list[tuple[Any, ...]]:
    """The call's commands as sent with `durability = "replica"`: the FCALL (or the
    command, or MULTI + commands + EXEC), then WAIT 1, on one connection: WAIT counts
    the replicas that have this connection's writes."""
    if isinstance(call, ScriptCall):
        sent: list[tuple[Any, ...]] = [fcall_command(call)]
    elif len(call.commands) == 1:
        sent = [call.commands[0]]
    else:
        sent = [("MULTI",), *call.commands, ("EXEC",)]
    return [*sent, ("WAIT", 1, wait_ms)]


def durable_reply(call: ScriptCall[Any] | CommandCall[Any], replies: list[Any]) -> Any:
    """The call's own reply among `durable_commands`' replies (errors are exception
    objects: the first is raised), once WAIT says a replica has it."""
    for reply in replies[:-1]:
        if isinstance(reply, redis.ResponseError):
            raise reply
    if isinstance(replies[-1], redis.ResponseError) or int(replies[-1]) < 1:
        raise DurabilityTimeout("no replica confirmed the write in time (WAIT 1)")
    own = replies[-2]
    return _raise_errors(own) if isinstance(call, CommandCall) and len(call.commands) > 1 else own


# Commands whose first argument names a subcommand, so their key comes second
# (XGROUP CREATE <key> ...): of these, gridmem sends XGROUP.
SUBCOMMAND_CONTAINERS = frozenset({"XGROUP", "XINFO", "OBJECT"})


def command_key(command: tuple[Any, ...]) -> Any:
    """The key a plain command names: the argument after its name (or its subcommand)."""
    return command[2] if str(command[0]).upper() in SUBCOMMAND_CONTAINERS else command[1]


def first_key(call: ScriptCall[Any] | CommandCall[Any]) -> Any:
    return call.keys[0] if isinstance(call, ScriptCall) else command_key(call.commands[0])


def retry_policy() -> dict[str, Any]:
    """tenacity arguments shared by the sync and async executors."""
    return {
        "retry": tenacity.retry_if_exception_type(RETRYABLE),
        "stop": tenacity.stop_after_attempt(5) | tenacity.stop_after_delay(15),
        "wait": tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.05),
        "reraise": True,
    }


def translate(exc: redis.ResponseError) -> Exception:
    """Our scripts' GM_* errors become their exception classes; anything else stays as is."""
    return script_error_from_reply(str(exc)) or exc


def is_function_missing(exc: redis.ResponseError) -> bool:
    """FCALL of a function the server does not have (a new server, or FUNCTION FLUSH)."""
    return str(exc).startswith("Function not found")


def is_library_present(exc: redis.ResponseError) -> bool:
    """FUNCTION LOAD of a library another worker loaded first."""
    return str(exc).startswith("Library ") and "already exists" in str(exc)


def fcall_command(call: ScriptCall[Any]) -> tuple[Any, ...]:
    return ("FCALL", call.script.function, len(call.keys), *call.keys, *call.args)


def slot_of(key: Any) -> int:
    """A key's cluster slot (of its hash tag): where every call naming it must go."""
    return key_slot(key.encode("utf-8") if isinstance(key, str) else bytes(key))


def transaction_slot(commands: Commands) -> int:
    """The slot of a MULTI/EXEC: its first command's key."""
    return slot_of(command_key(commands[0]))


Call = ScriptCall[T] | ReadCall[T] | CommandCall[T]


def answer_to_error(call: ScriptCall[Any] | CommandCall[Any], exc: redis.ResponseError) -> Any:
    """What an error reply means for `call`: a script's GM_* error is raised as its
    exception class; a command call's expected error (`answers`) is its reply."""
    if isinstance(call, ScriptCall):
        raise translate(exc) from None
    if not call.answers or not str(exc).startswith(call.answers):
        raise exc
    return exc


def _raise_errors(replies: list[Any]) -> list[Any]:
    """EXEC's replies, or the first error among them raised."""
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise reply
    return replies


def then_commands(call: Chained[Any, Any]) -> tuple[tuple[Any, ...], ...]:
    """What follows the write's FCALL in a Chained call's MULTI."""
    if isinstance(call.then, ReadCall):
        return call.then.commands
    return (fcall_command(call.then),)


def chain_commands(call: Chained[Any, Any], wait_ms: int | None) -> list[tuple[Any, ...]]:
    """A Chained call as sent: MULTI, the FCALL, what follows it, EXEC, and with
    `durability = "replica"` (a `wait_ms`) WAIT 1 behind it on the same connection."""
    sent = [("MULTI",), fcall_command(call.write), *then_commands(call), ("EXEC",)]
    return sent if wait_ms is None else [*sent, ("WAIT", 1, wait_ms)]


def chain_in_one_slot(call: Chained[Any, Any]) -> bool:
    """Whether a cluster can run the call as one MULTI (every key in the write's slot)."""
    then = call.then
    first = then.keys[0] if isinstance(then, ScriptCall) else command_key(then.commands[0])
    return slot_of(call.write.keys[0]) == slot_of(first)


def chain_idempotent(call: Chained[Any, Any]) -> bool:
    return call.write.idempotent and (isinstance(call.then, ReadCall) or call.then.idempotent)


def chain_missing_function(call: Chained[Any, Any], replies: list[Any]) -> bool:
    """Whether the server lacked gridmem's functions (when queued, or when run)."""
    scripts = 1 if isinstance(call.then, ReadCall) else 2
    done = replies[len(then_commands(call)) + 2]
    seen = done[:scripts] if isinstance(done, list) else replies[1 : 1 + scripts]
    return any(isinstance(r, redis.ResponseError) and is_function_missing(r) for r in seen)


def chain_replies(call: Chained[Any, Any], replies: list[Any]) -> tuple[Any, Any]:
    """The write's raw reply and what follows it (the reads' raw replies, or the
    second script's) among `chain_commands`' replies. A command refused when queued
    aborts the whole (EXECABORT): that refusal is raised (OOM, MOVED, ...); a
    script error is raised as its class; with WAIT, no replica in time is
    DurabilityTimeout."""
    done_at = len(then_commands(call)) + 2
    done = replies[done_at]
    if not isinstance(done, list):  # EXECABORT, or EXEC's own error
        for reply in [*replies[1:done_at], done]:
            if isinstance(reply, redis.ResponseError):
                raise reply
        raise redis.ResponseError(f"unexpected EXEC reply {done!r}")
    scripts = done[:1] if isinstance(call.then, ReadCall) else done[:2]
    for reply in scripts:
        if isinstance(reply, redis.ResponseError):
            raise translate(reply) from None
    if len(replies) > done_at + 1:
        waited = replies[done_at + 1]
        if isinstance(waited, redis.ResponseError) or int(waited) < 1:
            raise DurabilityTimeout("no replica confirmed the write in time (WAIT 1)")
    if isinstance(call.then, ReadCall):
        return done[0], _raise_errors(done[1:])
    return done[0], done[1]


class Executor:
    """Sends commands over a blocking redis-py client, plain or cluster (built with
    redis-py's retries off: connect, connect_cluster)."""

    def __init__(self, client: SyncClient, *, durability: Durability = "none") -> None:
        self.client = client
        # the cluster client when there is one: its calls are routed here (module docstring)
        self.cluster = client if isinstance(client, redis.cluster.RedisCluster) else None
        # "replica": every state change waits for one replica (durable_commands)
        self.durable = durability == "replica"
        self.wait_ms = DURABILITY_WAIT_MS  # how long a state change waits for a replica
        self.closed = False
        self._retrying = tenacity.Retrying(**retry_policy())

    @overload
    def call(self, call: Chained[T, U]) -> tuple[T, U]: ...
    @overload
    def call(self, call: Call[T]) -> T: ...
    def call(self, call: Any) -> Any:
        """Run one script call, MULTI/EXEC read, command call or chained call, and
        parse its reply."""
        if self.closed:
            raise StoreClosed
        if isinstance(call, ReadCall):
            return self._read(call)
        if isinstance(call, Chained):
            return self._chained(call)
        send: Callable[[Any], Any] = self._fcall if isinstance(call, ScriptCall) else self._commands
        if self.durable and writes(call):
            send = self._durable
        try:
            try:
                raw = send(call)
            except RETRYABLE:
                if not call.idempotent:
                    raise
                raw = self._retrying(send, call)
        except redis.ResponseError as exc:
            raw = answer_to_error(call, exc)
        return call.parse(raw)

    def submit(self, call: ScriptCall[T]) -> Pending[T]:
        """Send an idempotent script call now, read its reply later (Pending.result):
        the caller works while the server runs it, in one thread (flush's export
        batches: docs/benchmarks.md, Snapshots). The call holds a pooled connection
        of its own until then. Where a call cannot be split so (a cluster, a
        single-connection client, a call that writes or is not idempotent), it runs
        now, whole, and result() returns its answer."""
        if self.closed:
            raise StoreClosed
        client: Any = self.client
        if (
            self.cluster is not None
            or client.connection is not None
            or not call.idempotent
            or writes(call)
        ):
            return Pending(self, call, None, self.call(call))
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([hiredis.pack_command(fcall_command(call))])
        except RETRYABLE:
            conn.disconnect()  # idempotent: sent again the ordinary way, with retries
            pool.release(conn)
            return Pending(self, call, None, self.call(call))
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return Pending(self, call, conn)

    def transaction(self, commands: Commands) -> list[Any]:
        """EXEC's replies to MULTI + commands + EXEC, unparsed."""
        if self.closed:
            raise StoreClosed
        return self._transaction(commands)

    def command(self, *args: Any) -> Any:
        """One plain command, sent once. A blocking read a failover ended is Unblocked."""
        if self.closed:
            raise StoreClosed
        try:
            return self._send(*args)
        except redis.ResponseError as exc:
            raise unblocked(exc) from None

    def close(self) -> None:
        """Close the client; every call after this raises StoreClosed. A cluster
        client's close leaves its nodes' pools connected: they are closed too."""
        self.closed = True
        self.client.close()
        if self.cluster is not None:
            cluster: Any = self.cluster  # redis-py leaves its cluster methods untyped
            for node in cluster.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()

    def _send(self, *args: Any) -> Any:
        client: Any = self.client  # redis-py leaves execute_command untyped
        return client.execute_command(*args)

    def _read(self, call: ReadCall[T]) -> T:
        try:
            replies = self._transaction(call.commands)
        except RETRYABLE:
            replies = self._retrying(self._transaction, call.commands)
        except redis.OutOfMemoryError:  # a full Redis refuses MULTI, reads too
            if call.fallback is not None:
                replies = self.call(call.fallback())
            else:
                replies = [self._send(*command) for command in call.commands]
        return call.parse(replies)

    def _chained(self, call: Chained[Any, Any]) -> tuple[Any, Any]:
        if self.cluster is not None and not chain_in_one_slot(call):
            return self.call(call.write), self.call(call.then)  # two slots: the write first
        commands = chain_commands(call, self.wait_ms if self.durable else None)

        def on(client: Any) -> tuple[Any, Any]:
            replies = self._pipelined(client, commands)
            if chain_missing_function(call, replies):
                self._load(call.write, client.execute_command)
                replies = self._pipelined(client, commands)
            return chain_replies(call, replies)

        def run() -> tuple[Any, Any]:
            if self.cluster is None:
                return on(self.client)
            return self._on_primary(self.cluster, slot_of(call.write.keys[0]), on)

        try:
            written, then = run()
        except RETRYABLE:
            if not chain_idempotent(call):
                raise
            written, then = self._retrying(run)
        return call.write.parse(written), call.then.parse(then)

    def _commands(self, call: CommandCall[Any]) -> Any:
        """A lone command's reply, or EXEC's replies to several."""
        if len(call.commands) == 1:
            return self._send(*call.commands[0])
        return self._transaction(call.commands)

    def _fcall(self, call: ScriptCall[Any]) -> Any:
        """FCALL, loading the library first if the server lacks it. Another worker
        may load it at the same moment; "already exists" then means it is there.
        Sent with execute_command rather than redis-py's fcall(): the hot path
        then builds no extra tuples."""
        command = fcall_command(call)
        if self.cluster is not None:
            return self._fcall_cluster(self.cluster, call, command)
        try:
            return self._packed(command)
        except redis.ResponseError as exc:
            if not is_function_missing(exc):
                raise
            self._load(call, self._send)
            return self._packed(command)

    def _packed(self, command: tuple[Any, ...]) -> Any:
        """One command packed by hiredis and written to a pooled connection, its reply
        read there: redis-py's own path (execute_command) encodes each of an FCALL's
        ~26 arguments in Python, half of record's client time in one profile
        (docs/benchmarks.md). The pool is redis-py's: thread-safe (a connection is
        one thread's until released) and fork-safe (a child's first get_connection
        drops the parent's connections, ConnectionPool._checkpid). A single-connection
        client goes through execute_command, which holds its lock."""
        client: Any = self.client
        if client.connection is not None:
            return client.execute_command(*command)
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([hiredis.pack_command(command)])
            return conn.read_response()
        except redis.ResponseError:
            raise  # an error reply: the connection read it whole and stays usable
        except BaseException:
            conn.disconnect()  # dropped, never reused with a reply unread
            raise
        finally:
            pool.release(conn)

    def _fcall_cluster(self, cluster: Any, call: ScriptCall[Any], command: tuple[Any, ...]) -> Any:
        """FCALL on the primary of its keys' slot. redis-py follows a MOVED or ASK (the
        slot moved, in a failover: nothing ran) and updates its slot map; the node
        lacking the library is the slot's primary as that map says after the miss."""
        slot = slot_of(call.keys[0])
        try:
            return cluster.execute_command(*command, target_nodes=self._primary(cluster, slot))
        except redis.ResponseError as exc:
            if not is_function_missing(exc):
                raise
            node = self._primary(cluster, slot)
            self._load(call, lambda *args: cluster.execute_command(*args, target_nodes=node))
            return cluster.execute_command(*command, target_nodes=node)

    @staticmethod
    def _primary(cluster: redis.cluster.RedisCluster, slot: int) -> Any:
        return cluster.nodes_manager.get_node_from_slot(slot)

    @staticmethod
    def _load(call: ScriptCall[Any], send: Callable[..., Any]) -> None:
        try:
            send("FUNCTION", "LOAD", call.script.library.code)
        except redis.ResponseError as load_error:
            if not is_library_present(load_error):
                raise

    def _transaction(self, commands: Commands) -> list[Any]:
        """MULTI + commands + EXEC packed by hiredis and sent in one write.

        redis-py's Pipeline does the same with more Python per call: in one
        measured run its read came to 0.83x a hand-written list's, this one to
        0.99x (docs/architecture.md). The commands are keys and integers only:
        nothing for redis-py's encoder to do. On a cluster it runs on the slot's
        primary, through that node's own client and pool.
        """
        if self.cluster is None:
            return self._exec(self.client, commands)
        return self._on_primary(
            self.cluster, transaction_slot(commands), lambda node: self._exec(node, commands)
        )

    def _durable(self, call: ScriptCall[Any] | CommandCall[Any]) -> Any:
        """The call, then WAIT 1, in one write on one connection (durable_commands); the
        library loaded first where the server lacks it, as _fcall does."""
        commands = durable_commands(call, self.wait_ms)

        def on(client: Any) -> Any:
            replies = self._pipelined(client, commands)
            missing = replies[0]
            if isinstance(missing, redis.ResponseError) and is_function_missing(missing):
                assert isinstance(call, ScriptCall)  # only an FCALL misses a function
                self._load(call, client.execute_command)
                replies = self._pipelined(client, commands)
            if isinstance(replies[0], AskError):  # MOVED too: raised for _on_primary
                raise replies[0]
            return durable_reply(call, replies)

        if self.cluster is None:
            return on(self.client)
        return self._on_primary(self.cluster, slot_of(first_key(call)), on)

    def _on_primary(self, cluster: Any, slot: int, run: Callable[[Any], T]) -> T:
        """`run` with the client of the slot's primary (its own pool): a MOVED or ASK
        reply refreshes the slot map and is raised as Rerouted; a connection fault
        makes the next call read the slot map anew."""
        node = self._primary(cluster, slot)
        try:
            return run(cluster.get_redis_connection(node))
        except AskError as moved:  # MOVED too (a subclass)
            if isinstance(moved, MovedError):
                cluster.nodes_manager.move_slot(moved)
            raise _rerouted(moved) from None
        except (redis.ConnectionError, redis.TimeoutError):
            # the next call reads the slot map anew (redis-py's own way after a fault);
            # a cluster that cannot answer it now is asked again then
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                cluster.nodes_manager.initialize()
            raise

    @staticmethod
    def _pipelined(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The commands in one write on one connection; their replies, an error reply
        as its exception object (not raised: every reply is read)."""
        packed = b"".join([hiredis.pack_command(c) for c in commands])
        own = client.connection
        conn = own or client.connection_pool.get_connection()
        try:
            conn.send_packed_command([packed])
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as error:
                    replies.append(error)
        except BaseException:
            conn.disconnect()  # dropped, never reused with replies unread
            raise
        finally:
            if own is None:
                client.connection_pool.release(conn)
        return replies

    @staticmethod
    def _exec(client: Any, commands: Commands) -> list[Any]:
        packed = b"".join([_MULTI, *[hiredis.pack_command(c) for c in commands], _EXEC])
        own = client.connection  # set for single_connection_client=True
        conn = own or client.connection_pool.get_connection()
        try:  # inline, not a context manager: this is the hot read's whole Python cost
            conn.send_packed_command([packed])  # one write: a list item is one sendall
            for _ in range(len(commands) + 1):  # +OK, then +QUEUED per command
                conn.read_response()
            replies: list[Any] = conn.read_response()
        except BaseException:
            conn.disconnect()  # dropped, never reused with replies unread
            raise
        finally:
            if own is None:
                client.connection_pool.release(conn)
        return _raise_errors(replies)


class Pending(Generic[T]):
    """A script call Executor.submit sent, its reply not yet read (or its answer, for
    a call run at once). result() reads it, once; cancel() drops a reply never to be
    read (its connection is closed: a reply left unread must not reach another call)."""

    def __init__(
        self, executor: Executor, call: ScriptCall[T], conn: Any, answer: Any = None
    ) -> None:
        self._executor = executor
        self._call = call
        self._conn = conn
        self._answer = answer

    def result(self) -> T:
        conn, self._conn = self._conn, None
        if conn is None:
            answer: T = self._answer
            return answer
        executor, call = self._executor, self._call
        client: Any = executor.client  # a plain client: see submit()
        pool = client.connection_pool
        try:
            raw = conn.read_response()
        except redis.ResponseError as exc:  # read whole: the connection stays usable
            pool.release(conn)
            if is_function_missing(exc):
                executor._load(call, executor._send)
                return executor.call(call)  # sent again, the library loaded
            raw = answer_to_error(call, exc)
        except RETRYABLE:
            conn.disconnect()
            pool.release(conn)
            return executor.call(call)  # idempotent: sent again, with the retries
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        else:
            pool.release(conn)
        return call.parse(raw)

    def cancel(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            client: Any = self._executor.client
            client.connection_pool.release(conn)


def _connection_sender(conn: Any) -> Callable[..., Awaitable[Any]]:
    """A command sender on one asyncio connection the caller holds (a library load)."""

    async def send(*args: Any) -> Any:
        await conn.send_command(*args)
        return await conn.read_response()

    return send


def _rerouted(redirect: AskError) -> Rerouted:
    """MOVED (the slot map now says where the slot went) or ASK (a slot migrating:
    the map is not changed, and resending waits until the migration is done)."""
    return Rerouted(f"slot {redirect.slot_id} is served by {redirect.node_addr}")


class AsyncExecutor:
    """Executor for asyncio: the same calls as coroutines over `redis.asyncio`, plain
    or cluster.

    Its single-node MULTI/EXEC goes through redis-py's pipeline: the service is not
    bound by a read's Python cost (an LLM call follows every one). On a cluster it
    is written to a connection of the slot's primary (redis-py's cluster pipeline
    would do it on a throwaway event loop). An FCALL and a chained call are written
    and read raw on a connection of the one server (of the slot's primary): the
    service's every message makes three (issue 16).
    """

    def __init__(self, client: AsyncClient, *, durability: Durability = "none") -> None:
        self.client = client
        self.cluster = client if isinstance(client, async_cluster.RedisCluster) else None
        self.durable = durability == "replica"
        self.wait_ms = DURABILITY_WAIT_MS  # how long a state change waits for a replica
        self.closed = False
        self._retrying = tenacity.AsyncRetrying(**retry_policy())

    @overload
    async def call(self, call: Chained[T, U]) -> tuple[T, U]: ...
    @overload
    async def call(self, call: Call[T]) -> T: ...
    async def call(self, call: Any) -> Any:
        """As Executor.call."""
        if self.closed:
            raise StoreClosed
        if isinstance(call, ReadCall):
            return await self._read(call)
        if isinstance(call, Chained):
            return await self._chained(call)
        send: Callable[[Any], Awaitable[Any]] = (
            self._fcall if isinstance(call, ScriptCall) else self._commands
        )
        if self.durable and writes(call):
            send = self._durable
        try:
            try:
                raw = await send(call)
            except RETRYABLE:
                if not call.idempotent:
                    raise
                # a copy of the retrier: it keeps attempt state, and calls run concurrently
                raw = await self._retrying.copy()(send, call)
        except redis.ResponseError as exc:
            raw = answer_to_error(call, exc)
        return call.parse(raw)

    async def transaction(self, commands: Commands) -> list[Any]:
        """As Executor.transaction."""
        if self.closed:
            raise StoreClosed
        return await self._transaction(commands)

    async def command(self, *args: Any) -> Any:
        """As Executor.command. A cancelled blocking command (XREAD BLOCK) makes
        redis-py drop its connection: the reply is never read."""
        if self.closed:
            raise StoreClosed
        try:
            return await self._send(*args)
        except redis.ResponseError as exc:
            raise unblocked(exc) from None

    async def aclose(self) -> None:
        """As Executor.close (a cluster client's aclose disconnects every node)."""
        self.closed = True
        await self.client.aclose()

    async def _send(self, *args: Any) -> Any:
        client: Any = self.client
        return await client.execute_command(*args)

    async def _read(self, call: ReadCall[T]) -> T:
        """As Executor._read."""
        try:
            replies = await self._transaction(call.commands)
        except RETRYABLE:
            replies = await self._retrying.copy()(self._transaction, call.commands)
        except redis.OutOfMemoryError:  # a full Redis refuses MULTI, reads too
            if call.fallback is not None:
                replies = await self.call(call.fallback())
            else:
                replies = [await self._send(*command) for command in call.commands]
        return call.parse(replies)

    async def _commands(self, call: CommandCall[Any]) -> Any:
        """As Executor._commands."""
        if len(call.commands) == 1:
            return await self._send(*call.commands[0])
        return await self._transaction(call.commands)

    async def _fcall(self, call: ScriptCall[Any]) -> Any:
        """As Executor._fcall."""
        command = fcall_command(call)
        if self.cluster is not None:
            return await self._fcall_cluster(self.cluster, call, command)
        return await self._on_connection(0, lambda conn: self._fcall_on(conn, call, command))

    async def _fcall_on(self, conn: Any, call: ScriptCall[Any], command: tuple[Any, ...]) -> Any:
        """The FCALL on a connection of the one server, written and read raw as a chain
        is (_pipelined): redis-py's execute_command costs a third more CPU a call (its
        retry wrapper, timings, reply callbacks; FCALL has none), and every message
        of the service makes one (issue 16)."""
        [reply] = await self._pipelined(conn, [command])
        if isinstance(reply, redis.ResponseError) and is_function_missing(reply):
            await self._load(call, _connection_sender(conn))
            [reply] = await self._pipelined(conn, [command])
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply

    async def _fcall_cluster(
        self, cluster: async_cluster.RedisCluster, call: ScriptCall[Any], command: tuple[Any, ...]
    ) -> Any:
        """As Executor._fcall_cluster."""
        slot = slot_of(call.keys[0])
        try:
            node = await self._primary(cluster, slot)
            return await cluster.execute_command(*command, target_nodes=node)
        except redis.ResponseError as exc:
            if not is_function_missing(exc):
                raise
            node = await self._primary(cluster, slot)

            async def on_node(*args: Any) -> Any:
                return await cluster.execute_command(*args, target_nodes=node)

            await self._load(call, on_node)
            return await on_node(*command)

    @staticmethod
    async def _primary(cluster: async_cluster.RedisCluster, slot: int) -> Any:
        """The slot's primary; the slot map is read first if the client has none yet
        (a new client, or one a connection fault made forget it)."""
        await cluster.initialize()
        return cluster.nodes_manager.get_node_from_slot(slot)

    @staticmethod
    async def _load(call: ScriptCall[Any], send: Callable[..., Awaitable[Any]]) -> None:
        try:
            await send("FUNCTION", "LOAD", call.script.library.code)
        except redis.ResponseError as load_error:
            if not is_library_present(load_error):
                raise

    async def _transaction(self, commands: Commands) -> list[Any]:
        if self.cluster is not None:
            return await self._transaction_cluster(self.cluster, commands)
        pipe: Any = self.client.pipeline(transaction=True)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute()
        return replies

    async def _durable(self, call: ScriptCall[Any] | CommandCall[Any]) -> Any:
        """As Executor._durable: the call and WAIT 1 on one connection of the slot's
        primary (of the one server)."""
        commands = durable_commands(call, self.wait_ms)
        return await self._on_connection(
            slot_of(first_key(call)), lambda conn: self._durable_on(conn, call, commands)
        )

    async def _chained(self, call: Chained[Any, Any]) -> tuple[Any, Any]:
        """As Executor._chained."""
        if self.cluster is not None and not chain_in_one_slot(call):
            return await self.call(call.write), await self.call(call.then)
        commands = chain_commands(call, self.wait_ms if self.durable else None)

        async def on(conn: Any) -> tuple[Any, Any]:
            replies = await self._pipelined(conn, commands)
            if chain_missing_function(call, replies):
                await self._load(call.write, _connection_sender(conn))
                replies = await self._pipelined(conn, commands)
            return chain_replies(call, replies)

        async def run() -> tuple[Any, Any]:  # a coroutine function: tenacity awaits it
            return await self._on_connection(slot_of(call.write.keys[0]), on)

        try:
            written, then = await run()
        except RETRYABLE:
            if not chain_idempotent(call):
                raise
            written, then = await self._retrying.copy()(run)
        return call.write.parse(written), call.then.parse(then)

    async def _on_connection(self, slot: int, run: Callable[[Any], Awaitable[T]]) -> T:
        """`run` with a connection of the one server, or of the slot's primary: a MOVED
        or ASK reply there refreshes the slot map and is raised as Rerouted; a
        connection fault makes the next call read the slot map anew."""
        if self.cluster is None:
            client: Any = self.client  # a plain client (narrowed by self.cluster)
            pool = client.connection_pool
            conn = await pool.get_connection()
            try:
                return await run(conn)
            finally:
                await pool.release(conn)
        cluster = self.cluster
        node = await self._primary(cluster, slot)
        conn = node.acquire_connection()
        try:
            return await run(conn)
        except AskError as moved:  # MOVED too (a subclass)
            if isinstance(moved, MovedError):
                await cluster.nodes_manager.move_slot(moved)
            raise _rerouted(moved) from None
        except (redis.ConnectionError, redis.TimeoutError):
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                await cluster.nodes_manager.initialize()
            raise
        finally:
            node.release(conn)

    async def _durable_on(
        self, conn: Any, call: ScriptCall[Any] | CommandCall[Any], commands: list[tuple[Any, ...]]
    ) -> Any:
        replies = await self._pipelined(conn, commands)
        missing = replies[0]
        if isinstance(missing, redis.ResponseError) and is_function_missing(missing):
            assert isinstance(call, ScriptCall)  # only an FCALL misses a function
            await self._load(call, _connection_sender(conn))
            replies = await self._pipelined(conn, commands)
        if isinstance(replies[0], AskError):  # MOVED too: the caller reroutes
            raise replies[0]
        return durable_reply(call, replies)

    @staticmethod
    async def _pipelined(conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """As Executor._pipelined, on a connection the caller holds.

        The replies are read under one deadline, the connection's socket timeout, not
        one each (redis-py's per-read default: a timer scheduled and cancelled per
        reply was 7% of a worker's CPU, issue 16); `timeout=math.inf` is redis-py's
        way to read with none of its own."""
        packed = b"".join([hiredis.pack_command(c) for c in commands])
        try:
            await conn.send_packed_command([packed])
            replies: list[Any] = []
            async with asyncio.timeout(conn.socket_timeout):
                for _ in commands:
                    try:
                        replies.append(await conn.read_response(timeout=math.inf))
                    except redis.ResponseError as error:
                        replies.append(error)
        except TimeoutError:  # the deadline above, as redis-py's own read timeout says it
            await conn.disconnect()
            raise redis.TimeoutError("timeout reading a pipeline's replies") from None
        except BaseException:
            await conn.disconnect()  # dropped, never reused with replies unread
            raise
        return replies

    async def _transaction_cluster(
        self, cluster: async_cluster.RedisCluster, commands: Commands
    ) -> list[Any]:
        """As Executor._transaction on a cluster: MULTI + commands + EXEC in one write on
        a connection of the slot's primary, its replies read raw (no reply callbacks,
        as the sync executor's)."""
        node = await self._primary(cluster, transaction_slot(commands))
        packed = b"".join([_MULTI, *[hiredis.pack_command(c) for c in commands], _EXEC])
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command([packed])
            for _ in range(len(commands) + 1):  # +OK, then +QUEUED per command
                await conn.read_response()
            replies: list[Any] = await conn.read_response()
        except AskError as moved:  # MOVED too (a subclass)
            await conn.disconnect()
            if isinstance(moved, MovedError):
                await cluster.nodes_manager.move_slot(moved)
            raise _rerouted(moved) from None
        except (redis.ConnectionError, redis.TimeoutError):
            await conn.disconnect()
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                await cluster.nodes_manager.initialize()
            raise
        except BaseException:
            await conn.disconnect()  # dropped, never reused with replies unread
            raise
        finally:
            node.release(conn)
        return _raise_errors(replies)
