"""The full-memory promise (docs/operations.md), on real servers at `maxmemory`.

A full server refuses gridmem's writes whole (nothing half-written), while
reads, `delete`, `expire` and the idle sweep still run, so an operator (or the
sweep) can free memory. Issue 12 item 9: nothing tested it, so removing
`allow-oom` from sweep_idle passed the suite. fakeredis has no maxmemory: these run on the
real servers only, and put each server's settings back afterwards.

Writing this test found that a full Redis (7.x) refuses every command queued in
MULTI, so context() (one MULTI/EXEC of reads) failed there while Valkey 8 served
it: context() now falls back to lua/read_context.lua, whose reply must equal
EXEC's (checked here on every backend), and stats() (another MULTI/EXEC read) to
its reads one by one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio as redis_async

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import cli_binary
from gridmem.errors import BadScriptArgument
from gridmem.executor import translate
from gridmem.keys import KeySpace
from gridmem.reads import clock_fields
from gridmem.reads import context_read
from gridmem.scripts import load_scripts
from gridmem.store import AsyncConversationStore
from tests.conftest import REAL_ENGINES
from tests.helpers import avatar
from tests.helpers import dump_all

pytestmark = pytest.mark.both_doors  # every store test, through both doors

CLI = Path(__file__).resolve().parent.parent / "bin" / "gridmem-cli"
PUBLIC_TTL_MS = 1_800_000  # DESIGN section 4
TALKERS = [avatar(n) for n in range(6)]
IDLE = [avatar(50 + n) for n in range(4)]
BIG = "x" * 8000  # one filler record: just under the default max_text_bytes


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.real) for name in REAL_ENGINES])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server(real_servers: dict[str, EmbeddedValkey], engine: str) -> Iterator[EmbeddedValkey]:
    """The suite's server of `engine`, emptied, with its memory settings restored after."""
    server = real_servers[engine]
    client = server.client()
    client.flushall()
    saved = client.config_get("maxmemory*")
    client.config_set("maxmemory-policy", "noeviction")  # what docs/operations.md asks for
    try:
        yield server
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", saved["maxmemory-policy"])
        client.config_set("maxmemory", saved["maxmemory"])
        client.flushall()
        client.close()


def used_memory(client: redis_py.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fill(client: redis_py.Redis, store: ConversationStore) -> int:
    """Write until the server refuses, the way a busy store reaches maxmemory. Returns sessions."""
    client.config_set("maxmemory", str(used_memory(client) + 256 * 1024))
    for n in range(10_000):
        try:
            store.record(avatar(1000 + n), Channel.IM, AvatarMessage(text=BIG))
        except redis_py.exceptions.OutOfMemoryError:
            return n
    raise AssertionError("the server never refused a write")


def keep_full(client: redis_py.Redis, store: ConversationStore) -> None:
    """Hold the server over maxmemory (freeing memory must not be what lets a call through)."""
    used = used_memory(client)
    client.config_set("maxmemory", str(used - used // 4))
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        store.record(TALKERS[0], Channel.IM, AvatarMessage(text="probe"))


def said(who: str, channel: Channel) -> list[str]:
    """What each test resident says: the test's own corpus."""
    return [f"{who[-4:]} says {i} on {channel.value}" for i in range(3)]


def idle_expire(clock: ManualClock) -> None:
    """The idle sessions become exactly one TTL old: expired. A test calls it after
    fill(), since every write expires a few idle sessions itself (record_turn), and
    these must still be there for the full server's reads and sweep to meet."""
    clock.advance(1000)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(server: EmbeddedValkey, clock: ManualClock) -> ConversationStore:
    """Talkers on both channels, idle public sessions 1 s short of their TTL (see
    idle_expire), one operator deletion."""
    store = ConversationStore(server.client(), ConversationConfig(), clock=clock)
    for who in IDLE:
        store.record(who, Channel.PUBLIC, AvatarMessage(text="going quiet"))
    clock.advance(PUBLIC_TTL_MS - 1000)
    for who in TALKERS:
        for channel in Channel:
            for text in said(who, channel):
                store.record(who, channel, AvatarMessage(text=text))
    assert store.delete(TALKERS[-1], Channel.PUBLIC)  # an event to read back
    return store


def test_a_full_server_refuses_a_record_whole(
    server: EmbeddedValkey, store: ConversationStore
) -> None:
    client = server.client()
    # Given a server the store itself filled to maxmemory, held there (a loaded machine
    # let the server free a little memory after the refusal, and the next write through)
    assert fill(client, store) > 0
    keep_full(client, store)
    before = dump_all(client)
    # When records arrive for a live session and for a new resident
    for who in (TALKERS[0], avatar(999)):
        with pytest.raises(redis_py.exceptions.OutOfMemoryError):
            store.record(who, Channel.IM, AvatarMessage(text="one more thing"))
    # Then nothing at all was written: no turn, no sequence number, no clock, no event
    assert dump_all(client) == before
    # and once there is room again, the same store writes as before
    client.config_set("maxmemory", "0")
    store.record(TALKERS[0], Channel.IM, AvatarMessage(text="one more thing"))
    assert [m.content for m in store.context(TALKERS[0], Channel.IM)][-1] == "one more thing"


def test_a_full_server_refuses_a_record_with_its_context_whole(
    server: EmbeddedValkey, store: ConversationStore
) -> None:
    """Issue 16: record_and_context (one MULTI/EXEC) is refused whole at maxmemory,
    as record() is: nothing written, OutOfMemoryError to the caller."""
    client = server.client()
    assert fill(client, store) > 0
    keep_full(client, store)
    before = dump_all(client)
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        store.record_and_context(TALKERS[0], Channel.IM, AvatarMessage(text="one more"), "9-0")
    assert dump_all(client) == before
    client.config_set("maxmemory", "0")
    _, context = store.record_and_context(TALKERS[0], Channel.IM, AvatarMessage(text="one more"))
    assert [m.content for m in context][-1] == "one more"


def test_a_full_server_still_serves_every_read(
    server: EmbeddedValkey, store: ConversationStore, clock: ManualClock
) -> None:
    client = server.client()
    fillers = fill(client, store)
    idle_expire(clock)
    keep_full(client, store)
    # context and read_page give back what was said
    for who in TALKERS[:-1]:
        for channel in Channel:
            assert [m.content for m in store.context(who, channel)] == said(who, channel)
            assert [t.text for t in store.read_page(who, channel).turns] == said(who, channel)
    # list_metadata lists every live session (not the deleted one, not the idle ones)
    listed: set[tuple[str, str]] = set()
    cursor = None
    while True:
        page = store.list_metadata(cursor=cursor, limit=100)
        listed |= {(m.avatar_uuid, m.channel.value) for m in page.items}
        cursor = page.next_cursor
        if cursor is None:
            break
    expected = {(w, c.value) for w in TALKERS for c in Channel} - {(TALKERS[-1], "public")}
    expected |= {(avatar(1000 + n), "im") for n in range(fillers)}
    assert listed == expected
    # events and stats
    events = store.events(count=1000)
    assert [e.reason for e in events] == [ReasonCode.DELETED_OPERATOR]
    assert events[0].avatar_uuid == TALKERS[-1]
    assert store.stats().sessions[Channel.IM] == len(TALKERS) + fillers


def test_a_full_server_still_deletes_expires_and_sweeps(
    server: EmbeddedValkey, store: ConversationStore, clock: ManualClock
) -> None:
    client = server.client()
    fill(client, store)
    idle_expire(clock)
    # delete
    keep_full(client, store)
    assert store.delete(TALKERS[0], Channel.IM)
    assert store.context(TALKERS[0], Channel.IM) == []
    assert store.events(count=1000)[-1].reason is ReasonCode.DELETED_OPERATOR
    # expire
    keep_full(client, store)
    assert store.expire(TALKERS[1], Channel.IM)
    assert store.context(TALKERS[1], Channel.IM) == []
    assert store.events(count=1000)[-1].reason is ReasonCode.EXPIRED_OPERATOR
    # the idle sweep
    keep_full(client, store)
    assert store.sweep() == len(IDLE)
    swept = [e for e in store.events(count=1000) if e.reason is ReasonCode.EXPIRED_INACTIVITY]
    assert sorted(e.avatar_uuid for e in swept) == sorted(IDLE)
    assert not any(client.exists(f"gm:{{0}}:s:{who}:public:meta") for who in IDLE)


def test_the_operator_cli_deletes_on_a_full_server(
    server: EmbeddedValkey, store: ConversationStore
) -> None:
    client = server.client()
    fill(client, store)
    keep_full(client, store)
    env = {**os.environ, "GRIDMEM_REDIS_CLI": cli_binary()}
    done = subprocess.run(
        [str(CLI), "-s", str(server.socket_path), "delete", TALKERS[2], "im"],
        capture_output=True, check=False, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and "deleted the im session" in done.stdout, done.stderr
    assert store.context(TALKERS[2], Channel.IM) == []
    assert store.events(count=1000)[-1].avatar_uuid == TALKERS[2]


def test_the_read_context_fallback_replies_as_exec_does(
    make_store: Any, redis: redis_py.Redis, clock: ManualClock
) -> None:
    """Both ways of reading a session give the same replies, byte for byte, in every state."""
    store: ConversationStore = make_store(
        ConversationConfig(limits=Limits(max_turns_per_session=4))
    )
    for n in range(8):  # compaction: a summary
        store.record(TALKERS[0], Channel.IM, AvatarMessage(text=f"long talk {n}"))
    store.record(TALKERS[1], Channel.PUBLIC, AvatarMessage(text="short"))
    store.record(TALKERS[2], Channel.PUBLIC, AvatarMessage(text="soon idle"))
    clock.advance(PUBLIC_TTL_MS // 2)
    store.record(TALKERS[1], Channel.PUBLIC, AvatarMessage(text="still here"))
    clock.advance(PUBLIC_TTL_MS // 2)  # TALKERS[2]'s session has expired, unswept
    ops = store._ops
    cases = [(TALKERS[0], Channel.IM), (TALKERS[1], Channel.PUBLIC), (TALKERS[2], Channel.PUBLIC),
             (TALKERS[3], Channel.IM)]  # fmt: skip
    for who, channel in cases:
        session, shard = ops.keys.session(who, channel)
        for reading in (ops._now(), ops._now()._replace(boot="another-boot")):
            call = context_read(
                session, shard, channel, reading,
                lambda s=session, sh=shard, c=channel, r=reading: ops.scripts.read_context(
                    s, sh, sh.lru(c), clock_fields(r.boot)
                ),
            )  # fmt: skip
            assert call.fallback is not None
            exec_replies = store.executor.transaction(call.commands)
            script_replies = store.executor.call(call.fallback())
            # the same replies; a score may come back as a number or as its digits
            score = 2
            assert script_replies[:score] == exec_replies[:score]
            assert script_replies[score + 1 :] == exec_replies[score + 1 :]
            assert (script_replies[score] is None) == (exec_replies[score] is None)
            if exec_replies[score] is not None:
                assert float(script_replies[score]) == float(exec_replies[score])
            assert call.parse(script_replies) == call.parse(exec_replies)
    # and the states differ as they should: a summary, a live session, an expired one, none
    assert store.context(TALKERS[0], Channel.IM)[0].content.startswith("[Summary")
    assert store.context(TALKERS[2], Channel.PUBLIC) == store.context(TALKERS[3], Channel.IM) == []


def test_the_async_store_reads_a_full_server(
    server: EmbeddedValkey, store: ConversationStore, clock: ManualClock
) -> None:
    """The asyncio door takes the same fallback (the worker service reads through it)."""
    client = server.client()
    fill(client, store)
    keep_full(client, store)

    async def read() -> tuple[list[str], list[str], int, bool]:
        async_client = redis_async.Redis(unix_socket_path=str(server.socket_path))
        try:
            door = AsyncConversationStore(async_client, ConversationConfig(), clock=clock)
            messages = await door.context(TALKERS[0], Channel.PUBLIC)
            turns = (await door.read_page(TALKERS[0], Channel.PUBLIC)).turns
            public = (await door.stats()).sessions[Channel.PUBLIC]
            deleted = await door.delete(TALKERS[0], Channel.IM)
            return [m.content for m in messages], [t.text for t in turns], public, deleted
        finally:
            await async_client.aclose()

    contents, texts, public, deleted = asyncio.run(read())
    assert contents == texts == said(TALKERS[0], Channel.PUBLIC)
    assert public == store.stats().sessions[Channel.PUBLIC] > 0
    assert deleted and store.context(TALKERS[0], Channel.IM) == []


def test_read_context_refuses_a_malformed_member(redis: redis_py.Redis) -> None:
    scripts = load_scripts()
    session, shard = KeySpace().session(TALKERS[0], Channel.IM)
    keys = (session.meta, shard.clock, shard.lru_im, session.summary, session.turns)
    for member in ("", "not-a-member", f"{TALKERS[0]}:group", f"{TALKERS[0].upper()}:im"):
        with pytest.raises(BadScriptArgument, match=r"GM_BADARG member$"):
            try:
                redis.eval(scripts["read_context"].source, len(keys), *keys, member, "last")
            except redis_py.ResponseError as exc:
                raise translate(exc) from None


@pytest.mark.parametrize("fields", [(), ("last",) * 9, ("last", "o:bad boot"), ("",)])
def test_read_context_refuses_malformed_clock_fields(
    redis: redis_py.Redis, fields: tuple[str, ...]
) -> None:
    scripts = load_scripts()
    session, shard = KeySpace().session(TALKERS[0], Channel.IM)
    keys = (session.meta, shard.clock, shard.lru_im, session.summary, session.turns)
    with pytest.raises(BadScriptArgument, match=r"GM_BADARG clock_field$"):
        try:
            redis.eval(scripts["read_context"].source, len(keys), *keys, session.member, *fields)
        except redis_py.ResponseError as exc:
            raise translate(exc) from None
