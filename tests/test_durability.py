"""`[redis] durability = "replica"`: every state change waits for one replica (WAIT 1).

On the real cluster the write and its WAIT go on one connection of the slot's
primary, so the replica holds the turn when `record` returns; on a server with no
replica the WAIT times out and the caller sees DurabilityTimeout, with the turn
made on the primary (docs/scaling.md, Durability). Reads wait for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis as redis_py

from gridmem import AsyncConversationStore
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import connect
from gridmem import connect_cluster
from gridmem import connect_cluster_async
from gridmem import service_streams
from gridmem.embedded import EmbeddedCluster
from gridmem.embedded import EmbeddedValkey
from gridmem.errors import DurabilityTimeout
from gridmem.keys import KeySpace
from tests.helpers import avatar
from tests.test_cluster import on_node
from tests.test_shard_tags import slot

pytestmark = pytest.mark.real

SHARDS = 6
CONFIG = ConversationConfig(shards=SHARDS)


@pytest.fixture
def durable(cluster: EmbeddedCluster) -> Iterator[ConversationStore]:
    store = ConversationStore(
        connect_cluster(cluster.url), CONFIG, clock=ManualClock(), durability="replica"
    )
    yield store
    store.close()


def waits(cluster: EmbeddedCluster) -> int:
    """WAIT calls the primaries ran (INFO commandstats)."""
    total = 0
    for port in cluster.primaries():
        stats = on_node(cluster, port, "INFO", "commandstats")
        total += int(stats.get("cmdstat_wait", {}).get("calls", 0))
    return total


def owns(cluster: EmbeddedCluster, port: int, key: str) -> bool:
    try:
        on_node(cluster, port, "EXISTS", key)
    except redis_py.ResponseError:  # MOVED: another primary's slot
        return False
    return True


def turns_on_replica(cluster: EmbeddedCluster, key: str) -> int:
    """ZCARD of `key` read on a replica of the primary that holds it."""
    [primary] = [p for p in cluster.primaries() if owns(cluster, p, key)]
    [replica, *_] = cluster.replicas_of(primary)
    node = cluster.node_client(replica)
    try:
        node.execute_command("READONLY")  # same connection: a replica answers its own slots
        return int(node.execute_command("ZCARD", key))
    finally:
        node.close()


def test_each_state_change_waits_for_a_replica_that_then_holds_it(
    cluster: EmbeddedCluster, durable: ConversationStore
) -> None:
    durable.publish_limits()  # done before a first write: each shard's limits, waited for too
    before = waits(cluster)
    for n in range(6):
        durable.record(avatar(n), Channel.IM, AvatarMessage(text=f"hello {n}"))
        turns = KeySpace("gm", SHARDS).session(avatar(n), Channel.IM)[0].turns
        assert turns_on_replica(cluster, turns) == 1  # there when record returned
    waited = waits(cluster)
    assert waited - before >= 6  # a WAIT per record (and per other state change it makes)
    assert [m.content for m in durable.context(avatar(5), Channel.IM)] == ["hello 5"]
    assert waits(cluster) == waited  # a read waits for nothing


def test_a_record_with_its_context_waits_for_a_replica_too(
    cluster: EmbeddedCluster, durable: ConversationStore
) -> None:
    """Issue 16: record_and_context (one MULTI/EXEC) sends WAIT 1 behind its EXEC."""
    durable.publish_limits()
    before = waits(cluster)
    receipt, context = durable.record_and_context(
        avatar(40), Channel.IM, AvatarMessage(text="kept"), "1-0"
    )
    turns = KeySpace("gm", SHARDS).session(avatar(40), Channel.IM)[0].turns
    assert turns_on_replica(cluster, turns) == 1  # there when it returned
    assert waits(cluster) - before >= 1
    assert receipt.seq >= 1 and [m.content for m in context] == ["kept"]


def test_the_async_door_waits_too(cluster: EmbeddedCluster) -> None:
    async def run() -> tuple[bool, list[str]]:
        store = AsyncConversationStore(
            connect_cluster_async(cluster.url), CONFIG, durability="replica"
        )
        try:
            await store.publish_limits()
            before = waits(cluster)
            await asyncio.gather(
                *(
                    store.record(avatar(n), Channel.PUBLIC, AvatarMessage(text="hi"))
                    for n in range(8)
                )
            )
            context = [m.content for m in await store.context(avatar(7), Channel.PUBLIC)]
            return waits(cluster) - before >= 8, context
        finally:
            await store.aclose()

    assert asyncio.run(run()) == (True, ["hi"])
    for n in range(8):
        turns = KeySpace("gm", SHARDS).session(avatar(n), Channel.PUBLIC)[0].turns
        assert turns_on_replica(cluster, turns) == 1


def test_no_replica_in_time_is_an_error_the_caller_sees(
    real_servers: dict[str, EmbeddedValkey],
) -> None:
    # Given a lone server (no replica can confirm anything)
    client = connect(real_servers["valkey"].url)
    client.flushall()
    store = ConversationStore(client, ConversationConfig(), durability="replica")
    store.executor.wait_ms = 20
    try:
        # the store's first state change (its limits, published before a first write) is
        # idempotent: resent, then the timeout reaches the caller
        with pytest.raises(DurabilityTimeout, match="WAIT 1"):
            store.record(avatar(1), Channel.IM, AvatarMessage(text="unconfirmed"))
        # the primary made it: only its copy on a replica is unconfirmed
        assert client.exists(KeySpace().shard(0).limits) == 1
        assert store.context(avatar(1), Channel.IM) == []  # the record itself never ran
    finally:
        store.close()


@pytest.mark.parametrize("door", ["sync", "async"])
def test_the_service_queue_calls_wait_on_the_primary_of_their_own_key(
    cluster: EmbeddedCluster, door: str
) -> None:
    """A command whose key follows a subcommand (XGROUP CREATE <key>) went with its
    WAIT to the primary of the slot of "CREATE": MOVED, every attempt, so a worker
    with durability = "replica" died at its start on two partitions of three."""
    partitions = service_streams("gm", 3)
    assert len({slot(k.inbound) for k in partitions}) == 3  # three slots, three primaries
    if door == "sync":
        store = ConversationStore(connect_cluster(cluster.url), CONFIG, durability="replica")
        try:
            created = [
                store.executor.call(store.scripts.ensure_group(k, group="g")) for k in partitions
            ]
            again = [
                store.executor.call(store.scripts.ensure_group(k, group="g")) for k in partitions
            ]
        finally:
            store.close()
    else:

        async def run() -> tuple[list[bool], list[bool]]:
            door = AsyncConversationStore(
                connect_cluster_async(cluster.url), CONFIG, durability="replica"
            )
            try:
                ensure = door.scripts.ensure_group
                first = [await door.executor.call(ensure(k, group="g")) for k in partitions]
                second = [await door.executor.call(ensure(k, group="g")) for k in partitions]
                return first, second
            finally:
                await door.aclose()

        created, again = asyncio.run(run())
    assert (created, again) == ([True] * 3, [False] * 3)
