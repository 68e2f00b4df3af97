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
- `transaction(commands)`: EXEC's replies, without parsing (tests compare them).
- `command(*args)`: one plain command, sent once (the service's blocking XREAD,
  the HSET of a rejected entry's reason).

The replies of MULTI/EXEC differ by executor: the sync one reads them raw (its
own MULTI/EXEC), the async one through redis-py's pipeline, which applies its
reply callbacks (HGETALL as a dict); a call's parse takes both.

The store doors (gridmem/store.py), the service's inbound queue and the
supervisor (worker/) and snapshots (driven by the doors) all send through here.
A closed executor refuses every call with StoreClosed before a command is sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import hiredis
import redis
import redis.asyncio as redis_async
import tenacity

from gridmem.errors import StoreClosed, script_error_from_reply
from gridmem.replies import CommandCall, ReadCall, ScriptCall

T = TypeVar("T")

Commands = tuple[tuple[Any, ...], ...]

# Connection faults of idempotent calls are retried with backoff; nothing else is.
RETRYABLE = (redis.ConnectionError, redis.TimeoutError)

_MULTI = hiredis.pack_command(("MULTI",))
_EXEC = hiredis.pack_command(("EXEC",))


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


class Executor:
    """Sends commands over a blocking redis-py client (built with its retries off)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.closed = False
        self._retrying = tenacity.Retrying(**retry_policy())

    def call(self, call: Call[T]) -> T:
        """Run one script call, MULTI/EXEC read or command call, and parse its reply."""
        if self.closed:
            raise StoreClosed
        if isinstance(call, ReadCall):
            read: T = self._read(call)
            return read
        send: Callable[[Any], Any] = self._fcall if isinstance(call, ScriptCall) else self._commands
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

    def transaction(self, commands: Commands) -> list[Any]:
        """EXEC's replies to MULTI + commands + EXEC, unparsed."""
        if self.closed:
            raise StoreClosed
        return self._transaction(commands)

    def command(self, *args: Any) -> Any:
        """One plain command, sent once."""
        if self.closed:
            raise StoreClosed
        return self._send(*args)

    def close(self) -> None:
        """Close the client; every call after this raises StoreClosed."""
        self.closed = True
        self.client.close()

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
        try:
            return self._send(*command)
        except redis.ResponseError as exc:
            if not is_function_missing(exc):
                raise
            try:
                self._send("FUNCTION", "LOAD", call.script.library.code)
            except redis.ResponseError as load_error:
                if not is_library_present(load_error):
                    raise
            return self._send(*command)

    def _transaction(self, commands: Commands) -> list[Any]:
        """MULTI + commands + EXEC packed by hiredis and sent in one write.

        redis-py's Pipeline does the same with more Python per call: in one
        measured run its read came to 0.83x a hand-written list's, this one to
        0.99x (docs/architecture.md). The commands are keys and integers only:
        nothing for redis-py's encoder to do.
        """
        packed = b"".join([_MULTI, *[hiredis.pack_command(c) for c in commands], _EXEC])
        client: Any = self.client
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


class AsyncExecutor:
    """Executor for asyncio: the same calls as coroutines over `redis.asyncio`.

    Its MULTI/EXEC goes through redis-py's pipeline: the service is not bound by a
    read's Python cost (an LLM call follows every one).
    """

    def __init__(self, client: redis_async.Redis) -> None:
        self.client = client
        self.closed = False
        self._retrying = tenacity.AsyncRetrying(**retry_policy())

    async def call(self, call: Call[T]) -> T:
        """As Executor.call."""
        if self.closed:
            raise StoreClosed
        if isinstance(call, ReadCall):
            read: T = await self._read(call)
            return read
        send: Callable[[Any], Awaitable[Any]] = (
            self._fcall if isinstance(call, ScriptCall) else self._commands
        )
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
        return await self._send(*args)

    async def aclose(self) -> None:
        """As Executor.close."""
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
        try:
            return await self._send(*command)
        except redis.ResponseError as exc:
            if not is_function_missing(exc):
                raise
            try:
                await self._send("FUNCTION", "LOAD", call.script.library.code)
            except redis.ResponseError as load_error:
                if not is_library_present(load_error):
                    raise
            return await self._send(*command)

    async def _transaction(self, commands: Commands) -> list[Any]:
        pipe: Any = self.client.pipeline(transaction=True)
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute()
        return replies
