"""The store on a real Valkey Cluster: where calls go, what lands on which primary.

The behavioural modules marked `cluster` run their assertions here unchanged
(tests/conftest.py); this module checks what only a cluster has: each key on the
primary that owns its slot, sessions shared out over the primaries, no COMMAND
GETKEYS per FCALL, the function library loaded on a primary that lacks it, a
failover followed, every node's connections closed. Slots come from the test's
own CRC16 (tests/test_shard_tags.py), never from the code under test.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from gridmem import AsyncConversationStore
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import Settings
from gridmem import connect_cluster
from gridmem import connect_cluster_async
from gridmem.embedded import EmbeddedCluster
from gridmem.keys import KeySpace
from tests.helpers import avatar
from tests.test_shard_tags import slot

pytestmark = pytest.mark.real

SHARDS = 16
WIDE = Limits(max_active_sessions=16_000, max_events=16_000)


@pytest.fixture
def store(cluster: EmbeddedCluster) -> Iterator[ConversationStore]:
    store = ConversationStore(
        connect_cluster(cluster.url),
        ConversationConfig(shards=SHARDS, limits=WIDE),
        clock=ManualClock(),
    )
    yield store
    store.close()


def node_of_slot(cluster: EmbeddedCluster) -> dict[int, int]:
    """slot -> port of the primary serving it, as the servers say (CLUSTER SLOTS)."""
    node = cluster.node_client(cluster.primaries()[0])
    try:
        owners = {}
        for low, high, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            for s in range(int(low), int(high) + 1):
                owners[s] = int(primary[1])
        return owners
    finally:
        node.close()


def on_node(cluster: EmbeddedCluster, port: int, *command: Any) -> Any:
    node = cluster.node_client(port)
    try:
        return node.execute_command(*command)
    finally:
        node.close()


def node_keys(cluster: EmbeddedCluster, port: int) -> list[str]:
    return [k.decode() for k in on_node(cluster, port, "KEYS", "*")]


def command_calls(cluster: EmbeddedCluster, port: int) -> Counter[str]:
    """INFO commandstats of one node: calls per command (`fcall`, `command|getkeys`)."""
    stats = on_node(cluster, port, "INFO", "commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def test_sessions_spread_over_the_primaries_each_key_where_its_slot_is(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    """With shards = 16, each of 3 primaries holds 33% +- 10% of 3,000 sessions, and
    every key lives on the primary that owns its slot, beside its shard's index."""
    # Given 3,000 sessions: 1,500 avatars on both channels
    for n in range(1_500):
        for channel in Channel:
            store.record(avatar(n), channel, AvatarMessage(text="hi"))
    # Then each primary's keys are in the slots it owns, and its share is about a third
    owners = node_of_slot(cluster)
    sessions: Counter[int] = Counter()
    space = KeySpace("gm", SHARDS)
    for port in cluster.primaries():
        keys = node_keys(cluster, port)
        assert keys and all(owners[slot(k)] == port for k in keys)
        meta = [k for k in keys if k.endswith(":meta")]
        indexed = sum(on_node(cluster, port, "ZCARD", k) for k in keys if k.endswith(":sessions"))
        assert len(meta) == indexed  # each session beside its shard's index
        sessions[port] = len(meta)
    assert sum(sessions.values()) == 3_000 == sum(store.stats().sessions.values())
    shares = {port: count / 3_000 for port, count in sessions.items()}
    print(f"per-primary shares of 3,000 sessions over {SHARDS} shards: {shares}")
    assert len(shares) == 3 and all(0.23 <= share <= 0.43 for share in shares.values()), shares
    # and the 16 shards' indexes are 5, 5 and 6 to a primary: the tags' slots spread
    per_primary = Counter(owners[slot(shard.sessions)] for shard in space.all_shards())
    assert sorted(per_primary.values()) == [5, 5, 6], per_primary


def test_each_fcall_goes_to_its_primary_without_asking_for_its_keys(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    """redis-py would send COMMAND GETKEYS before every FCALL (its keys are 'movable'):
    the executor routes FCALL itself, straight to the primary owning the slot."""
    for n in range(60):  # the library loaded on every primary (a miss counts as a call)
        store.record(avatar(n), Channel.IM, AvatarMessage(text="warm up"))
    owners = node_of_slot(cluster)
    before = {port: command_calls(cluster, port) for port in cluster.primaries()}
    expected: Counter[int] = Counter()
    for n in range(60):
        store.record(avatar(n), Channel.IM, AvatarMessage(text="hi"))
        session, _ = KeySpace("gm", SHARDS).session(avatar(n), Channel.IM)
        expected[owners[slot(session.meta)]] += 1
    for port in cluster.primaries():
        after = command_calls(cluster, port)
        assert after["fcall"] - before[port]["fcall"] == expected[port]
        assert after["command|getkeys"] == before[port]["command|getkeys"]
        assert after["command|getkeys-and-flags"] == before[port]["command|getkeys-and-flags"]


def test_a_primary_without_the_library_gets_it_on_the_first_call(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    """Load-on-miss on whichever primary lacks the functions (a new node, a flushed one)."""
    for n in range(40):
        store.record(avatar(n), Channel.PUBLIC, AvatarMessage(text="before"))
    owners = node_of_slot(cluster)
    bare = owners[slot(KeySpace("gm", SHARDS).session(avatar(7), Channel.PUBLIC)[0].meta)]
    on_node(cluster, bare, "FUNCTION", "FLUSH")
    assert on_node(cluster, bare, "FUNCTION", "LIST") == []
    store.record(avatar(7), Channel.PUBLIC, AvatarMessage(text="after"))
    assert [m.content for m in store.context(avatar(7), Channel.PUBLIC)] == ["before", "after"]
    assert len(on_node(cluster, bare, "FUNCTION", "LIST")) == 1


def test_the_async_door_on_the_cluster_loads_routes_and_closes(cluster: EmbeddedCluster) -> None:
    async def run() -> list[str]:
        store = AsyncConversationStore(
            connect_cluster_async(cluster.url), ConversationConfig(shards=SHARDS, limits=WIDE)
        )
        try:
            for n in range(30):
                await store.record(avatar(n), Channel.IM, AvatarMessage(text=f"m{n}"))
            on_node(cluster, cluster.primaries()[1], "FUNCTION", "FLUSH")
            await asyncio.gather(
                *(
                    store.record(avatar(n), Channel.IM, AvatarMessage(text="again"))
                    for n in range(30)
                )
            )
            return [m.content for m in await store.context(avatar(29), Channel.IM)]
        finally:
            await store.aclose()

    assert asyncio.run(run()) == ["m29", "again"]


def test_close_closes_every_node_connection(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    for n in range(30):  # connections to every primary
        store.record(avatar(n), Channel.IM, AvatarMessage(text="hi"))
        store.context(avatar(n), Channel.IM)
    client: Any = store.redis
    pools = [n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection]
    assert len(pools) >= 3
    store.close()
    for pool in pools:
        assert all(conn._sock is None for conn in pool._available_connections)
        assert not pool._in_use_connections


def replica_has(cluster: EmbeddedCluster, port: int, key: str) -> bool:
    """EXISTS on a replica: READONLY first, on the same connection (else MOVED)."""
    node = cluster.node_client(port)
    try:
        pipe = node.pipeline(transaction=False)
        pipe.execute_command("READONLY")
        pipe.exists(key)
        return bool(pipe.execute()[1])
    finally:
        node.close()


def wait_for(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a cluster's state change, with a deadline


def test_a_failover_is_followed_by_both_calls_and_reads(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    """After CLUSTER FAILOVER the old primary answers MOVED: the FCALL is redirected
    and the MULTI/EXEC read resent to the new primary; nothing is lost or doubled."""
    who = avatar(3)
    session, _ = KeySpace("gm", SHARDS).session(who, Channel.IM)
    store.record(who, Channel.IM, AvatarMessage(text="before"))
    store.context(who, Channel.IM)  # the client knows the old primary
    loop = asyncio.new_event_loop()
    door = AsyncConversationStore(
        connect_cluster_async(cluster.url), store.config, clock=store.clock
    )
    assert len(loop.run_until_complete(door.context(who, Channel.IM))) == 1  # the async one too
    old = node_of_slot(cluster)[slot(session.meta)]
    replica = cluster.replicas_of(old)[0]
    # Given the replica takes over, and replicated the session
    wait_for(lambda: replica_has(cluster, replica, session.meta), "replication")
    assert on_node(cluster, replica, "CLUSTER", "FAILOVER") == b"OK"
    wait_for(lambda: node_of_slot(cluster)[slot(session.meta)] == replica, "the failover")
    cluster.wait_healthy()
    # When the store reads and writes that session
    assert [m.content for m in store.context(who, Channel.IM)] == ["before"]
    store.record(who, Channel.IM, AvatarMessage(text="after"))  # no idempotency key
    assert [m.content for m in store.context(who, Channel.IM)] == ["before", "after"]
    # and through the async door: its read resent, its FCALL redirected
    try:
        seen = loop.run_until_complete(door.context(who, Channel.IM))
        assert [m.content for m in seen] == ["before", "after"]
        loop.run_until_complete(door.record(who, Channel.IM, AvatarMessage(text="async")))
    finally:
        loop.run_until_complete(door.aclose())
        loop.close()
    assert on_node(cluster, replica, "ZCARD", session.turns) == 3


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(f"GRIDMEM_REDIS__{name.upper()}", value)
    return Settings.load()


def test_from_config_with_cluster_true_builds_cluster_clients(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load(monkeypatch, url=cluster.url, cluster="true")
    with ConversationStore.from_config(settings) as store:
        assert isinstance(store.redis, redis_py.RedisCluster)
        for n in range(12):
            store.record(avatar(n), Channel.IM, AvatarMessage(text="hi"))
        assert store.stats().sessions[Channel.IM] == 12

    async def run() -> int:
        async with AsyncConversationStore.from_config(settings) as door:
            assert isinstance(door.redis, redis_py.asyncio.RedisCluster)
            return len(await door.context(avatar(5), Channel.IM))

    assert asyncio.run(run()) == 1
