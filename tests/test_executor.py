"""The executors (gridmem/executor.py) are the only code that sends commands.

An AST scan of the library and the service finds no command sent anywhere else,
and the executors' own duties are pinned here through both I/O styles: a server
without gridmem's function library gets it loaded and the call made once more,
and a closed executor sends nothing.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem.errors import BadScriptArgument
from gridmem.errors import StoreClosed
from gridmem.executor import AsyncExecutor
from gridmem.executor import Executor
from gridmem.replies import Chained
from gridmem.scripts import Scripts
from tests.conftest import CommandCounter
from tests.helpers import avatar

ROOT = Path(__file__).resolve().parent.parent

# redis-py's ways to send a command, the raw connection's included. Names as
# generic as get/set/delete/scan/info are left out (dicts, paths, logs):
# `.redis.<anything>(` is caught instead.
SENDS = {
    "execute_command", "send_command", "send_packed_command", "read_response",
    "pipeline", "transaction", "fcall", "fcall_ro", "function_load", "function_flush",
    "eval", "evalsha", "script_load", "xread", "xreadgroup", "xadd", "xack",
    "xautoclaim", "xclaim", "xlen", "xrange", "xrevrange", "xgroup_create", "hset",
    "hget", "hgetall", "hdel", "hincrby", "zadd", "zrange", "zcard", "zrem", "lrange",
    "smembers", "scan_iter", "hscan", "zscan", "flushall",
}  # fmt: skip
# The one module that sends. worker/demo.py plays the grid's bridge, an outside
# client of the published streams (it writes gm:inbound, reads gm:outbound and
# dumps every key to prove nothing unredacted is stored): it must not go through
# gridmem's executor, or the demo would not show what a bridge sees.
# gridmem/embedded.py pings and shuts down the server it runs (ping, shutdown: not
# in SENDS): the server's life, not its data.
SENDERS = {"gridmem/executor.py", "worker/demo.py"}


def command_calls(path: Path) -> list[str]:
    """`line: name` of every call in a file that sends a command through redis-py."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        on_client = isinstance(owner, ast.Attribute) and owner.attr == "redis"
        if node.func.attr in SENDS or on_client:
            found.append((node.lineno, node.func.attr))
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_only_the_executor_sends_commands() -> None:
    files = sorted([*ROOT.glob("gridmem/*.py"), *ROOT.glob("worker/*.py")])
    assert ROOT / "gridmem/executor.py" in files
    offenders = {
        f"{path.relative_to(ROOT)}:{call}"
        for path in files
        if str(path.relative_to(ROOT)) not in SENDERS
        for call in command_calls(path)
    }
    assert not offenders


def test_the_scan_sees_a_command_sent_elsewhere(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "async def f(self):\n"
        "    await self.store.redis.hset('k', 'f', 'v')\n"
        "    await client.xread({'s': '0'}, block=1000)\n"
        "    return conn.execute_command('PING')\n"
    )
    assert command_calls(sample) == ["2: hset", "3: xread", "4: execute_command"]
    assert command_calls(ROOT / "gridmem/executor.py")  # the executor's own are seen


def _a_script() -> Any:
    from gridmem.keys import KeySpace

    return Scripts().read_backlog(KeySpace().service())


def test_a_flushed_library_is_loaded_again_and_the_call_made_once_more(
    redis: Any, command_counter: CommandCounter
) -> None:
    """FUNCTION FLUSH (or a new server) between two calls: the executor loads the
    library and repeats the call; the caller sees only its reply."""
    store = ConversationStore(redis)
    store.record(avatar(1), "im", AvatarMessage(text="before the flush"))
    redis.function_flush()
    command_counter.commands.clear()
    store.executor.call(_a_script())
    sent = [c for c in command_counter.commands if c != "<connection>"]
    assert sent == ["FCALL", "FUNCTION", "FCALL"]
    assert [m.content for m in store.context(avatar(1), "im")] == ["before the flush"]


def test_the_async_executor_loads_a_missing_library_too(redis: Any) -> None:
    if isinstance(redis, fakeredis.FakeRedis):
        server = redis.connection_pool.connection_kwargs["server"]
        client: Any = fakeredis.FakeAsyncRedis(server=server)
    else:
        from gridmem.store import connect_async

        kwargs = redis.connection_pool.connection_kwargs
        where = kwargs.get("path")
        client = connect_async(
            f"unix://{where}" if where else f"redis://{kwargs['host']}:{kwargs['port']}"
        )

    async def scenario() -> tuple[int, int]:
        executor = AsyncExecutor(client)
        try:
            await executor.command("FUNCTION", "FLUSH")
            before = len(await executor.command("FUNCTION", "LIST"))
            await executor.call(_a_script())
            return before, len(await executor.command("FUNCTION", "LIST"))
        finally:
            await executor.aclose()

    assert asyncio.run(scenario()) == (0, 1)  # the library, loaded by the call


def test_a_closed_executor_sends_nothing(redis: Any, command_counter: CommandCounter) -> None:
    executor = Executor(redis)
    executor.close()
    command_counter.commands.clear()
    with pytest.raises(StoreClosed):
        executor.call(_a_script())
    with pytest.raises(StoreClosed):
        executor.command("PING")
    with pytest.raises(StoreClosed):
        executor.transaction((("PING",),))
    assert command_counter.commands == []


def test_a_replayed_record_says_it_was_a_duplicate(redis: Any) -> None:
    store = ConversationStore(redis)
    first = store.record(avatar(1), "im", AvatarMessage(text="once"), idempotency_key="k1")
    again = store.record(avatar(1), "im", AvatarMessage(text="once"), idempotency_key="k1")
    other = store.record(avatar(1), "im", AvatarMessage(text="twice"), idempotency_key="k2")
    assert (first.duplicate, again.duplicate, other.duplicate) == (False, True, False)
    assert again == first and again.seq == first.seq


def test_packed_fcalls_from_many_threads_share_the_pool_safely(real_redis: Any) -> None:
    """The sync executor writes FCALL straight to pooled connections (Executor._packed):
    threads calling one store at once each get their own reply, none another's."""
    import threading

    store = ConversationStore(real_redis)
    store.record(avatar(1), "im", AvatarMessage(text="warm up"))
    receipts: dict[int, list[int]] = {}

    def writer(n: int) -> None:
        receipts[n] = [
            store.record(avatar(100 + n), "im", AvatarMessage(text=f"t{n} {i}")).seq
            for i in range(40)
        ]

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then: every thread saw its own seqs in order, all distinct, each turn stored once
    seqs = [s for got in receipts.values() for s in got]
    assert len(seqs) == len(set(seqs)) == 240
    assert all(got == sorted(got) for got in receipts.values())
    for n in range(6):
        contents = [m.content for m in store.context(avatar(100 + n), "im")]
        assert contents == [f"t{n} {i}" for i in range(40)]


def test_a_forked_child_uses_its_own_connection(real_redis: Any) -> None:
    """A child forked after the parent's FCALLs must not read replies from the
    parent's socket: redis-py's pool drops inherited connections (_checkpid)."""
    import os

    store = ConversationStore(real_redis)
    parent_seq = store.record(avatar(1), "im", AvatarMessage(text="parent before")).seq
    pid = os.fork()
    if pid == 0:  # the child: record through the inherited store, report by exit code
        code = 1
        try:
            receipt = store.record(avatar(2), "im", AvatarMessage(text="child"))
            code = 0 if receipt.seq > parent_seq else 2
        finally:
            os._exit(code)
    after = store.record(avatar(1), "im", AvatarMessage(text="parent after"))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert after.seq > parent_seq
    assert [m.content for m in store.context(avatar(2), "im")] == ["child"]
    assert [m.content for m in store.context(avatar(1), "im")] == ["parent before", "parent after"]


def _chained_call(store: ConversationStore, who: str, text: str) -> Chained[Any, Any]:
    """record_and_context's call, the steps before it (the layout's publish) run."""
    op = store._ops.record_and_context(who, "im", AvatarMessage(text=text), "1-0")
    call = next(op)
    while not isinstance(call, Chained):
        call = op.send(store.executor.call(call))
    return call


def test_a_chained_call_loads_a_flushed_library_and_runs_once(
    redis: Any, command_counter: CommandCounter
) -> None:
    store = ConversationStore(redis)
    call = _chained_call(store, avatar(1), "after the flush")
    redis.function_flush()
    command_counter.commands.clear()
    receipt, context = store.executor.call(call)
    assert command_counter.commands.count("FUNCTION") == 1  # loaded once, the whole resent
    assert receipt.seq == 1 and [e for e in context.entries if b"after" in bytes(e)]
    assert [m.content for m in store.context(avatar(1), "im")] == ["after the flush"]


def test_a_chained_call_raises_the_scripts_error_and_writes_nothing(redis: Any) -> None:
    store = ConversationStore(redis)
    call = _chained_call(store, avatar(2), "refused")
    bad = call._replace(write=call.write._replace(args=("soon", *call.write.args[1:])))
    with pytest.raises(BadScriptArgument, match="now_mono"):
        store.executor.call(bad)
    assert store.context(avatar(2), "im") == []
    assert store.read_page(avatar(2), "im").turns == []


def _async_client_like(redis: Any) -> Any:
    """An asyncio client of the test's server (fakeredis: the same FakeServer)."""
    if isinstance(redis, fakeredis.FakeRedis):
        server = redis.connection_pool.connection_kwargs["server"]
        return fakeredis.FakeAsyncRedis(server=server)
    from gridmem.store import connect_async

    kwargs = redis.connection_pool.connection_kwargs
    where = kwargs.get("path")
    return connect_async(
        f"unix://{where}" if where else f"redis://{kwargs['host']}:{kwargs['port']}"
    )


def _cut_once(executor: Any) -> None:
    """The executor's next pipelined MULTI (a chained call's write) runs on the server,
    then its connection is cut before the reply is read (a ConnectionError); later
    ones, and pipelined FCALLs of their own, go through."""
    import redis as redis_py

    pipelined, cuts = executor._pipelined, []

    def chained(commands: list[tuple[Any, ...]]) -> bool:
        return commands[0][0] == "MULTI"

    async def cutting_async(conn: Any, commands: list[tuple[Any, ...]]) -> Any:
        if not cuts and chained(commands):
            cuts.append(1)
            await pipelined(conn, commands)
            raise redis_py.ConnectionError("cut")
        return await pipelined(conn, commands)

    def cutting(*args: Any) -> Any:
        if not cuts and chained(args[-1]):
            cuts.append(1)
            pipelined(*args)
            raise redis_py.ConnectionError("cut")
        return pipelined(*args)

    executor._pipelined = cutting_async if isinstance(executor, AsyncExecutor) else cutting


@pytest.mark.parametrize("key", ["1-0", None])
def test_a_chained_call_is_resent_after_a_connection_fault_only_if_idempotent(
    redis: Any, key: str | None
) -> None:
    """Issue 16: a connection cut before the reply of record_and_context's MULTI is
    resent only where the record has an idempotency key (stored once either way);
    through both executors (the async one's retry once got a coroutine it never ran)."""
    import redis as redis_py

    from gridmem import AsyncConversationStore

    sync = ConversationStore(redis)
    sync.publish_limits()

    def through_sync() -> Any:
        _cut_once(sync.executor)
        return sync.record_and_context(avatar(1), "im", AvatarMessage(text="a"), key)

    async def through_async() -> Any:
        store = AsyncConversationStore(_async_client_like(redis))
        _cut_once(store.executor)
        try:
            return await store.record_and_context(avatar(2), "im", AvatarMessage(text="b"), key)
        finally:
            await store.aclose()

    for who, send in ((avatar(1), through_sync), (avatar(2), lambda: asyncio.run(through_async()))):
        if key is None:
            with pytest.raises(redis_py.ConnectionError):
                send()
        else:
            receipt, context = send()
            assert receipt.duplicate and len(context) == 1  # the resend found it stored
        assert len(sync.read_page(who, "im").turns) == 1  # stored once, resent or not


@pytest.mark.real
def test_a_pipeline_read_past_the_socket_timeout_raises_and_drops_its_connection(
    real_redis: Any,
) -> None:
    """Issue 16: the async executor reads a pipeline's replies under one deadline (the
    socket timeout), not one per reply. Past it: redis.TimeoutError (retryable), and
    the connection is dropped, so the next call on the pool's only connection gets
    its own reply, not the late one of the cut pipeline."""
    import redis as redis_py

    from gridmem.store import connect_async

    where = real_redis.connection_pool.connection_kwargs["path"]

    async def run() -> tuple[list[Any], list[Any]]:
        client = connect_async(f"unix://{where}", max_connections=1, socket_timeout=0.2)
        executor = AsyncExecutor(client)
        try:
            with pytest.raises(redis_py.TimeoutError):
                # the first reply comes at once, the second after 1 s: past the deadline
                await executor._on_connection(
                    0,
                    lambda c: executor._pipelined(c, [("SET", "k", "v"), ("BLPOP", "nothing", 1)]),
                )
            after = await executor._on_connection(
                0, lambda c: executor._pipelined(c, [("GET", "k"), ("ECHO", "mine")])
            )
            quick = await executor._on_connection(
                0, lambda c: executor._pipelined(c, [("BLPOP", "nothing", "0.05")])
            )
            return after, quick
        finally:
            await executor.aclose()

    after, quick = asyncio.run(run())
    assert after == [b"v", b"mine"]
    assert quick == [None]  # a wait inside the deadline is no timeout


def _an_export(store: ConversationStore) -> Any:
    """The first export_sessions call of a flush: read-only, idempotent, whole sessions."""
    return next(store._ops.export_batch(0, ""))


def test_a_submitted_call_is_answered_when_read_and_loads_a_missing_library(
    redis: Any, command_counter: CommandCounter
) -> None:
    """Executor.submit (flush's export batches, issue 16) sends now and reads later:
    the reply is the one call() gives, and a server without the library gets it
    loaded and the call sent once more, as call() does."""
    store = ConversationStore(redis)
    store.record(avatar(1), "im", AvatarMessage(text="exported"))
    expected = store.executor.call(_an_export(store))
    assert [s.member for s in expected.sessions] == [f"{avatar(1)}:im"]
    redis.function_flush()
    command_counter.commands.clear()
    pending = store.executor.submit(_an_export(store))
    assert [c for c in command_counter.commands if c != "<connection>"] == ["FCALL"]
    assert pending.result() == expected
    assert [c for c in command_counter.commands if c != "<connection>"] == [
        "FCALL", "FUNCTION", "FCALL"
    ]  # fmt: skip


def test_a_submitted_call_cut_before_its_reply_is_sent_again(redis: Any) -> None:
    """A connection lost between sending and reading (a server restart) is a
    connection fault of an idempotent call: sent again, with the retries."""
    store = ConversationStore(redis)
    store.record(avatar(1), "im", AvatarMessage(text="exported"))
    expected = store.executor.call(_an_export(store))
    pending = store.executor.submit(_an_export(store))
    pending._conn.disconnect()  # the reply is lost with the connection
    assert pending.result() == expected


def test_a_cancelled_call_leaves_no_reply_for_the_next_call(redis: Any) -> None:
    """A flush that fails with calls under way cancels them: their connections are
    closed, never handed to the next call with a reply it did not ask for."""
    store = ConversationStore(redis)
    store.record(avatar(1), "im", AvatarMessage(text="exported"))
    expected = store.executor.call(_a_script())
    for _ in range(3):
        store.executor.submit(_an_export(store)).cancel()
        assert store.executor.call(_a_script()) == expected
    pool = redis.connection_pool
    assert not getattr(pool, "_in_use_connections", set())  # every one released
