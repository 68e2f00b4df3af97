"""Store behaviour not covered elsewhere: truncation, error mapping, retries, from_config."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import CorruptRecord
from gridmem import Limits
from gridmem import ManualClock
from gridmem import Settings
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedServerError
from gridmem.embedded import SharedValkey
from gridmem.embedded import keeper_running
from gridmem.errors import BadScriptArgument
from gridmem.keys import KeySpace
from gridmem.prepare import TRUNCATION_MARKER
from gridmem.scripts import ScriptCall
from tests.conftest import CommandCounter
from tests.conftest import short_tempdir
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

A = avatar(1)


def test_text_over_limit_is_stored_truncated(make_store: Any) -> None:
    store: ConversationStore = make_store(
        ConversationConfig(limits=Limits(max_text_bytes=50, max_tool_result_bytes=40))
    )
    receipt = store.record(A, "public", AvatarMessage(text="ü" * 100))
    assert receipt.truncated
    tool = store.record(A, "public", ToolSummary(tool="t", summary="x" * 41))
    assert tool.truncated
    short = store.record(A, "public", AvatarMessage(text="ü" * 25))  # exactly 50 bytes
    assert not short.truncated
    texts = [t.text for t in store.read_page(A, "public").turns]
    assert texts[0].endswith(TRUNCATION_MARKER) and len(texts[0].encode()) <= 50
    assert len(texts[1].encode()) <= 40 and texts[2] == "ü" * 25


def _bad_list_metadata(store: ConversationStore) -> ScriptCall[Any]:
    """A call the script refuses (GM_BADARG after), built by hand past the typed method."""
    shard = store._ops.keys.shard(0)
    keys = (shard.sessions, shard.lru_public, shard.lru_im, shard.clock)
    return ScriptCall(store._ops.scripts.by_name["list_metadata"], keys, (0, 0, "b", "x", 1), list)


@pytest.mark.single_node  # one server's function library (cluster: tests/test_cluster.py)
def test_script_error_is_mapped_and_not_retried(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    def sent() -> list[str]:
        return [c for c in command_counter.commands if c != "<connection>"]

    bad = _bad_list_metadata(store)
    with pytest.raises(BadScriptArgument, match="GM_BADARG after"):
        store.executor.call(bad)
    assert sent() == ["FCALL", "FUNCTION", "FCALL"]  # a new server: the library is loaded once
    command_counter.commands.clear()
    with pytest.raises(BadScriptArgument, match="GM_BADARG after"):
        store.executor.call(bad)
    assert sent() == ["FCALL"]


def test_a_refused_call_leaves_no_state_for_the_next(store: ConversationStore) -> None:
    """Library functions share lib.lua's locals between calls: bad_field must not stick."""
    with pytest.raises(BadScriptArgument):
        store.executor.call(_bad_list_metadata(store))
    store.record(A, "public", AvatarMessage(text="still fine"))
    assert [m.content for m in store.context(A, "public")] == ["still fine"]
    assert store.events() == []


@pytest.mark.single_node  # one server's function library (cluster: tests/test_cluster.py)
def test_library_loaded_by_another_worker_meanwhile(store: ConversationStore, redis: Any) -> None:
    """Two workers may both find the library missing; the second FUNCTION LOAD is refused."""
    library = store._ops.scripts.by_name["record_turn"].library
    original = redis.execute_command

    def racing(*args: Any, **kw: Any) -> Any:
        if args[0] == "FUNCTION":
            original(*args, **kw)  # the other worker wins the race
        return original(*args, **kw)

    redis.execute_command = racing
    assert store.record(A, "public", AvatarMessage(text="hi")).seq == 1
    assert [lib[1].decode() for lib in redis.function_list(library=library.name)] == [library.name]


@pytest.mark.single_node  # one server's function library (cluster: tests/test_cluster.py)
def test_functions_carry_their_declared_flags(store: ConversationStore, redis: Any) -> None:
    store.record(A, "public", AvatarMessage(text="loads the library"))
    library = store._ops.scripts.by_name["read_page"].library
    [listed] = redis.function_list(library=library.name)
    flags = {fields[1].decode(): {flag.decode() for flag in fields[5]} for fields in listed[5]}
    assert flags[library.name + "_read_page"] == {"no-writes"}
    assert flags[library.name + "_delete_session"] == {"allow-oom"}
    assert flags[library.name + "_record_turn"] == set()
    assert len(flags) == len(store._ops.scripts.by_name)


@pytest.mark.single_node  # one server's function library (cluster: tests/test_cluster.py)
def test_versions_side_by_side(store: ConversationStore, redis: Any) -> None:
    """Another gridmem version's library does not disturb this one's functions."""
    scripts = store._ops.scripts.by_name
    other = scripts["read_page"].library.code.replace(
        scripts["read_page"].library.name, "gridmem_other"
    )
    redis.execute_command("FUNCTION", "LOAD", other)
    store.record(A, "public", AvatarMessage(text="hi"))
    assert store.stats().sessions[Channel.PUBLIC] == 1
    names = {lib[1].decode() for lib in redis.function_list()}
    assert {"gridmem_other", scripts["read_page"].library.name} <= names


class FlakyConnection(redis_py.UnixDomainSocketConnection):
    """Drops the connection on the first send after `arm()`: a fault mid-call."""

    armed = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if FlakyConnection.armed:
            FlakyConnection.armed = False
            self.disconnect()
            raise redis_py.ConnectionError("connection reset (test)")
        super().send_packed_command(command, check_health)


@pytest.mark.real
def test_idempotent_calls_retry_after_connection_fault(real_servers: Any) -> None:
    server = real_servers["valkey"]
    pool = redis_py.ConnectionPool(
        connection_class=FlakyConnection, path=str(server.socket_path), retry=None
    )
    client = redis_py.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
    client.flushall()
    store = ConversationStore(client, clock=ManualClock())
    store.record(A, "public", AvatarMessage(text="warm up"))
    FlakyConnection.armed = True
    store.record(A, "public", AvatarMessage(text="with key"), idempotency_key="1-1")
    assert not FlakyConnection.armed  # the fault happened, and the call was retried
    FlakyConnection.armed = True
    assert len(store.context(A, "public")) == 2  # a read (MULTI/EXEC): retried
    assert not FlakyConnection.armed
    FlakyConnection.armed = True
    with pytest.raises(redis_py.ConnectionError):
        store.record(A, "public", AvatarMessage(text="no key"))  # could apply twice: not retried
    assert [t.text for t in store.read_page(A, "public").turns] == ["warm up", "with key"]
    # plain commands alike: reads and a whole-hash replacement are retried, an XADD is not
    for idempotent in (store.stats, store.events, store.publish_limits):
        FlakyConnection.armed = True
        idempotent()
        assert not FlakyConnection.armed
    FlakyConnection.armed = True
    dead = store.scripts.dead_letter(
        KeySpace().service(), entry_id="1-1", reason="gone", max_entries=10
    )
    with pytest.raises(redis_py.ConnectionError):
        store.executor.call(dead)  # a resend could add a second dead letter
    assert client.xlen("gm:dead") == 0


def test_context_refuses_entries_of_another_session(store: ConversationStore, redis: Any) -> None:
    store.record(A, "public", AvatarMessage(text="mine"))
    redis.zadd("gm:{0}:s:" + A + ":public:turns", {"999|1|" + "f" * 32 + '|["a","planted"]': 999})
    with pytest.raises(CorruptRecord):
        store.context(A, "public")


@pytest.mark.real
def test_from_config_starts_a_private_server() -> None:
    base = short_tempdir("gm-cfg-")
    try:
        settings = Settings(storage_path=base)
        with ConversationStore.from_config(settings, clock=ManualClock()) as store:
            store.record(A, "im", AvatarMessage(text="embedded"))
            assert [m.content for m in store.context(A, "im")] == ["embedded"]
            socket = base / "valkey" / "valkey.sock"
            assert socket.exists()
            assert (base / "valkey").stat().st_mode & 0o777 == 0o700
            probe = redis_py.Redis(unix_socket_path=str(socket), decode_responses=True)
            assert probe.config_get("save") == {"save": ""}
            assert probe.config_get("appendonly") == {"appendonly": "no"}
        # close() stopped the private server
        with pytest.raises(redis_py.ConnectionError):
            probe.ping()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.real
def test_from_config_under_a_file_says_which_storage_path() -> None:
    """Issue 13, items 3 and 4: a storage_path whose parent is a file ended in a bare
    NotADirectoryError from deep in pathlib; now a GridmemError names the setting's
    path, and nothing is left attached or running."""
    base = short_tempdir("gm-cfg-")
    try:
        (base / "file").write_text("not a directory")
        with pytest.raises(EmbeddedServerError, match=f"cannot use storage_path {base}/file/"):
            ConversationStore.from_config(Settings(storage_path=base / "file" / "data"))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.real
def test_a_failed_start_hook_leaves_no_server_and_no_wait() -> None:
    """A user whose start-up work (the restore) fails lets go of the server at once: the
    keeper stops it (before, the user waited for a keeper that needed its lock)."""
    base = short_tempdir("gm-cfg-")
    shared = SharedValkey(base / "valkey")

    def fail() -> None:
        raise RuntimeError("restore failed")

    try:
        with pytest.raises(RuntimeError):
            shared.attach(on_start=fail)
        assert not shared.attached
        # Then the keeper, with no user, stops the server on its own
        deadline = time.monotonic() + 30
        while keeper_running(base / "valkey"):
            assert time.monotonic() < deadline, "the keeper is still running"
            time.sleep(0.02)  # polling another process's exit, with a deadline
        # and a new user starts a new one, and is the last one out
        assert shared.attach() is True
        assert shared.detach() is True and not keeper_running(base / "valkey")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.real
def test_a_storage_path_deleted_under_its_server_leaves_no_orphan() -> None:
    """A storage_path removed while its server runs (a test's temporary directory, an
    operator's rm -r): the keeper could no longer take its lock to stop the server,
    crashed, and left the server running. Now it stops the server whatever happens."""
    base = short_tempdir("gm-cfg-")
    store = ConversationStore.from_config(Settings(storage_path=base))
    pid = int(store.redis.info("server")["process_id"])
    shutil.rmtree(base)
    store.close()  # the last user, with no directory left to wait in
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, "the server is still running"
        time.sleep(0.02)  # polling another process's exit, with a deadline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stats_counts_everything_and_nothing_more(
    store: ConversationStore, clock: ManualClock
) -> None:
    from gridmem import Channel
    from gridmem import ReasonCode

    store.record(A, "public", AvatarMessage(text="password=hunter22 and sk-" + "Zq8x" * 8))
    store.record(A, "im", AvatarMessage(text="hello"))
    store.record(avatar(2), "im", AvatarMessage(text="hi"))
    store.delete(avatar(2), "im")
    clock.advance(1_800_000)
    store.sweep()
    stats = store.stats()
    assert stats.sessions == {Channel.PUBLIC: 0, Channel.IM: 1}
    assert stats.redactions == 2
    assert stats.events == {ReasonCode.DELETED_OPERATOR: 1, ReasonCode.EXPIRED_INACTIVITY: 1}
    [meta] = store.list_metadata().items
    assert stats.stored_bytes == meta.byte_count
    assert "hunter22" not in stats.model_dump_json()


def test_a_started_operation_that_ends_before_any_command_gives_its_value(redis: Any) -> None:
    """ConversationStore._start (flush's export: first call sent now, read later) runs
    an operation that returns before its first command, as _drive does, instead of
    letting its StopIteration out."""
    store = ConversationStore(redis)

    def ends_at_once() -> Any:
        return "nothing to send"
        yield  # a generator, as every operation is

    assert store._start(ends_at_once()).result() == "nothing to send"
    assert store._drive(ends_at_once()) == "nothing to send"
