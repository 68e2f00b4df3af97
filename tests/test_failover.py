"""A primary fails over under a steady load of records and service traffic (issue 15).

Each test starts its own small cluster (its nodes are failed over or killed: the
suite's shared one stays whole), then runs, in one event loop:

- a recorder: turns with idempotency keys to sessions spread over every primary; a
  call that fails in the failover is resent with its key until acknowledged;
- a bridge: messages posted to the inbound streams, each on its avatar's partition;
- a worker (worker.service.Worker) answering them through an instant fake model,
  both on cluster clients as `[redis] cluster = true` builds them.

Mid-run one primary fails over:

(a) `CLUSTER FAILOVER` on its replica (a manual failover: the primary stops taking
    writes until the replica has caught up): zero lost, zero duplicated turns, zero
    unanswered messages.
(b) SIGKILL of the primary (the cluster fails it over after its node timeout). To
    make asynchronous replication lose something at all on a fast loopback, the
    victim's replicas are stopped (SIGSTOP) first and a 48 MiB filler is written to
    the victim, more than the kernel's socket buffers hold: replication traffic after
    it waits in the primary's own memory, which the SIGKILL loses. Then the replicas
    resume and one takes over. With `durability = "replica"` no acknowledged turn may
    be lost (each waited for a replica: WAIT 1); with "none" the number lost is
    measured and printed (the honest cost of asynchronous replication).

Expected turns come from what the test sent and saw acknowledged, never from the
code under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import traceback
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from redis.crc import key_slot

from gridmem import AsyncConversationStore
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import Settings
from gridmem import connect_cluster_async
from gridmem import service_streams
from gridmem.clock import ManualClock
from gridmem.embedded import EmbeddedCluster
from gridmem.executor import RETRYABLE
from gridmem.keys import ServiceKeys
from gridmem.store import async_client_for
from tests.conftest import short_tempdir
from tests.helpers import avatar
from tests.test_partitions import check_requests_hold_one_key
from tests.test_partitions import expected_partition
from worker.llm import Message

pytestmark = [pytest.mark.real, pytest.mark.slow]

PARTITIONS, SHARDS = 3, 6
BRIDGE_AVATARS = 12  # x 2 channels, one message each a round
RECORDER_AVATARS = 12  # their own sessions, IM only
DEADLINE = 60.0  # seconds, for a loaded 2-core machine; a pass takes a fraction


class EchoChat:
    """The model: answers "re: <newest user text>" at once, keeping every request."""

    name = "echo"

    def __init__(self) -> None:
        self.requests: list[list[Message]] = []

    async def complete(self, messages: list[Message]) -> str:
        self.requests.append(messages)
        return "re: " + [m["content"] for m in messages if m["role"] == "user"][-1]

    async def aclose(self) -> None:
        return None


@dataclass
class Load:
    """What the test sent and what it saw acknowledged."""

    acknowledged: list[int] = field(default_factory=list)  # the recorder's turn numbers
    posted: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    # ^ (uuid, channel) -> [(entry ID, text)], in the order posted
    refused_posts: int = 0  # XADDs that failed (a SIGKILLed primary): maybe not posted
    resends: int = 0  # recorder calls resent after a failover fault
    calling_since: float | None = None  # when the recorder's call in hand was first sent

    def stalled(self, now: float, seconds: float) -> bool:
        """The recorder's call in hand has waited `seconds` (for a replica, say)."""
        return self.calling_since is not None and now - self.calling_since > seconds


def recorder_avatar(n: int) -> str:
    return avatar(1000 + n % RECORDER_AVATARS)


async def record_until_acknowledged(store: AsyncConversationStore, n: int, load: Load) -> None:
    """One turn, resent with its idempotency key after a failover fault until a
    receipt comes back (anything else is a bug and fails the test)."""
    loop = asyncio.get_running_loop()
    load.calling_since = loop.time()
    deadline = loop.time() + DEADLINE
    while True:
        try:
            await store.record(
                recorder_avatar(n), Channel.IM, AvatarMessage(text=f"turn {n}"), f"k{n}"
            )
            load.acknowledged.append(n)
            load.calling_since = None
            return
        except RETRYABLE:
            if loop.time() > deadline:
                raise
            load.resends += 1
            await asyncio.sleep(0.05)  # the cluster electing a new primary (deadline above)


async def recorder(store: AsyncConversationStore, load: Load, turns: int) -> None:
    for n in range(turns):
        await record_until_acknowledged(store, n, load)


async def bridge(
    client: Any,
    services: tuple[ServiceKeys, ...],
    load: Load,
    rounds: int,
    every: int,
    *,
    go: asyncio.Event | None = None,
) -> None:
    """Posts a round of messages (every bridge avatar, both channels) each time the
    recorder has `every` more turns acknowledged, so the traffic spans the failover;
    while `go` is clear, it holds its next round."""
    for n in range(rounds):
        await until(lambda n=n: len(load.acknowledged) >= n * every, f"round {n}")
        if go is not None:
            await go.wait()
        for who in range(BRIDGE_AVATARS):
            for channel in ("public", "im"):
                text = f"{who}/{channel}/{n}"
                fields = {"avatar_uuid": avatar(who), "channel": channel, "text": text}
                keys = services[expected_partition(avatar(who), PARTITIONS)]
                try:
                    entry = (await client.xadd(keys.inbound, fields)).decode()
                except RETRYABLE:
                    load.refused_posts += 1  # the bridge does not know: it is not counted
                    continue
                load.posted.setdefault((avatar(who), channel), []).append((entry, text))


async def outbound(client: Any, services: tuple[ServiceKeys, ...]) -> list[dict[str, str]]:
    found = []
    for keys in services:
        for _, fields in await client.xrange(keys.outbound):
            found.append({k.decode(): v.decode() for k, v in fields.items()})
    return found


async def until(
    check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = DEADLINE
) -> None:
    """Poll a cluster's state or the load's progress, with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await _value(check()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # polling other processes, with a deadline


def role(cluster: EmbeddedCluster, port: int) -> str:
    node = cluster.node_client(port, socket_timeout=2)
    try:
        return str(node.execute_command("ROLE")[0].decode())
    except (redis_py.ConnectionError, redis_py.TimeoutError):
        return "down"
    finally:
        node.close()


def settings_for(cluster: EmbeddedCluster, durability: str) -> Settings:
    return Settings(
        redis={"url": cluster.url, "cluster": True, "durability": durability},
        worker={"concurrency": 8, "lease_seconds": 5},
        conversation={"partitions": PARTITIONS, "shards": SHARDS},
    )


@dataclass
class Running:
    worker: asyncio.Task[None]  # Worker.run()
    chat: EchoChat  # the worker's model
    store: AsyncConversationStore  # the recorder's (and the test's reads)
    client: Any  # the bridge's cluster client


@contextlib.asynccontextmanager
async def service(settings: Settings, url: str) -> AsyncIterator[Running]:
    """A worker running on the cluster, the recorder's store and the bridge's client,
    each on its own cluster client as `[redis] cluster = true` builds them."""
    from worker.service import Worker

    def store() -> AsyncConversationStore:
        return AsyncConversationStore(
            async_client_for(settings.redis, url),
            settings.conversation,
            clock=ManualClock(),
            durability=settings.redis.durability,
        )

    worker_store, recorder_store = store(), store()
    for door in (worker_store, recorder_store):
        door.executor.wait_ms = 500  # WAIT 1 500: a stopped replica times out quickly
    chat = EchoChat()
    worker = Worker(worker_store, chat, settings, name="w-failover")
    running = Running(asyncio.create_task(worker.run()), chat, recorder_store, None)
    running.client = connect_cluster_async(url)
    try:
        yield running
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running.worker, DEADLINE)
        for closing in (worker_store.aclose(), recorder_store.aclose(), running.client.aclose()):
            with contextlib.suppress(Exception):
                await closing


async def stored_texts(store: AsyncConversationStore, uuid: str, channel: str) -> list[str]:
    page = await store.read_page(uuid, channel, direction="forward", limit=200)
    assert not page.has_more
    return [turn.text for turn in page.turns]


async def check_recorded(store: AsyncConversationStore, load: Load) -> set[int]:
    """No turn stored twice, nothing stored that was not sent; the acknowledged turns
    that are missing (returned)."""
    stored: list[str] = []
    for a in range(RECORDER_AVATARS):
        stored += await stored_texts(store, recorder_avatar(a), "im")
    assert len(stored) == len(set(stored)), "a turn stored twice"
    numbers = {int(text.removeprefix("turn ")) for text in stored}
    return set(load.acknowledged) - numbers


def victim_of(cluster: EmbeddedCluster, services: tuple[ServiceKeys, ...]) -> int:
    """The primary that owns partition 0's slot (and some shards' slots)."""
    return owner_of(cluster, key_slot(services[0].inbound.encode()))


def test_a_manual_failover_under_load_loses_and_doubles_nothing() -> None:
    """(a): CLUSTER FAILOVER on a replica mid-run, records and service traffic going."""
    directory: Path = short_tempdir("gm-failover-")
    with EmbeddedCluster(directory, replicas=1, node_timeout_ms=1_000) as cluster:
        settings = settings_for(cluster, "none")
        services = service_streams("gm", PARTITIONS)
        victim = victim_of(cluster, services)
        [replica] = cluster.replicas_of(victim)
        load = Load()

        async def scenario() -> None:
            async with service(settings, cluster.url) as running:
                store, client = running.store, running.client
                go = asyncio.Event()
                go.set()
                producers = [
                    asyncio.create_task(recorder(store, load, 400)),
                    asyncio.create_task(bridge(client, services, load, 8, 40, go=go)),
                ]
                # Given the load is going (turns acknowledged, rounds of messages posted)
                await until(lambda: len(load.acknowledged) >= 100, "the first turns")
                # and the worker waits on the streams (every message so far answered: a
                # blocked XREAD on the victim, as between bursts), the recorder going on
                go.clear()
                posted = sum(len(v) for v in load.posted.values())
                await until(lambda: answered_at_least(client, services, posted), "a quiet queue")
                # When the replica takes over from its primary
                node = cluster.node_client(replica)
                try:
                    assert node.execute_command("CLUSTER", "FAILOVER") == b"OK"
                finally:
                    node.close()
                await until(lambda: role(cluster, replica) == "master", "the failover")
                go.set()
                await asyncio.gather(*producers)
                alive(running.worker)
                # Then every message is answered once, in order; no turn lost or doubled
                expected = sum(len(v) for v in load.posted.values())
                await until(
                    lambda: answered_at_least(client, services, expected), "every message answered"
                )
                replies = await outbound(client, services)
                check_service(load, replies)
                check_requests_hold_one_key(running.chat.requests)
                for (uuid, channel), posted in load.posted.items():
                    turns = [t for _, text in posted for t in (text, "re: " + text)]
                    assert await stored_texts(store, uuid, channel) == turns, (uuid, channel)
                assert not await check_recorded(store, load)
                assert load.refused_posts == 0
                assert len(load.acknowledged) == 400

        asyncio.run(asyncio.wait_for(scenario(), 4 * DEADLINE))


async def _value(result: bool | Awaitable[bool]) -> bool:
    return await result if inspect.isawaitable(result) else result


def alive(worker: asyncio.Task[None]) -> None:
    """The worker is still running: a failover fault it let through ended it."""
    if worker.done():
        raise AssertionError("".join(traceback.format_exception(worker.exception())))


async def answered_at_least(client: Any, services: tuple[ServiceKeys, ...], n: int) -> bool:
    return len(await outbound(client, services)) >= n


def named(uuid: str, entry: str) -> tuple[int, str]:
    """A message's name: entry IDs are per stream, so with its partition."""
    return expected_partition(uuid, PARTITIONS), entry


def answered_names(replies: list[dict[str, str]]) -> list[tuple[int, str]]:
    return [named(r["avatar_uuid"], r["in_reply_to"]) for r in replies]


def posted_names(load: Load) -> set[tuple[int, str]]:
    return {named(uuid, entry) for (uuid, _), msgs in load.posted.items() for entry, _ in msgs}


def check_service(load: Load, replies: list[dict[str, str]]) -> None:
    """Each posted message answered once, a key's replies in the order posted."""
    names = answered_names(replies)
    assert len(names) == len(set(names)), "a message answered twice"
    assert set(names) == posted_names(load)
    for (uuid, channel), msgs in load.posted.items():
        order = [
            r["in_reply_to"] for r in replies if (r["avatar_uuid"], r["channel"]) == (uuid, channel)
        ]
        assert order == [entry for entry, _ in msgs], (uuid, channel)


FILLER_BYTES = 24 * 1024 * 1024  # twice: more than loopback's socket buffers hold


def open_a_replication_gap(cluster: EmbeddedCluster, victim: int) -> list[int]:
    """Stop the victim's replicas and fill its replication link past the kernel's
    buffers: what it replicates next waits in its own memory. The stopped pids."""
    fillers = [key_on(cluster, victim, f"filler{n}") for n in range(2)]  # before the stop
    stopped = []
    for port in cluster.replicas_of(victim):
        [node] = [n for n in cluster.nodes if n.port == port]
        assert node.pid is not None
        # however long it was stopped, the replica may take over (its data is what the
        # test looks at); by default one that lost its primary for long would not
        client = cluster.node_client(port)
        try:
            client.config_set("cluster-replica-validity-factor", 0)
        finally:
            client.close()
        os.kill(node.pid, signal.SIGSTOP)
        stopped.append(node.pid)
    client = cluster.node_client(victim)
    try:
        for name in fillers:
            client.set(name, b"x" * FILLER_BYTES)
    finally:
        client.close()
    return stopped


def owner_of(cluster: EmbeddedCluster, slot: int) -> int:
    """The port of the primary serving `slot`, as the nodes say (CLUSTER SLOTS)."""
    node = cluster.node_client(cluster.primaries()[0])
    try:
        ranges = node.execute_command("CLUSTER", "SLOTS")
    finally:
        node.close()
    for low, high, primary, *_ in ranges:
        if int(low) <= slot <= int(high):
            return int(primary[1])
    raise AssertionError(f"no primary serves slot {slot}")


def key_on(cluster: EmbeddedCluster, port: int, base: str) -> str:
    """A key whose slot the primary at `port` serves."""
    for n in range(1_000):
        name = f"{base}:{n}"
        if owner_of(cluster, key_slot(name.encode())) == port:
            return name
    raise AssertionError(f"no key found on {port}")


@pytest.mark.parametrize("durability", ["replica", "none"])
def test_a_killed_primary_loses_no_acknowledged_turn_with_replica_durability(
    durability: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """(b): SIGKILL of a primary mid-run behind a replication gap, records and service
    traffic going; with durability = "replica" nothing acknowledged is lost."""
    directory: Path = short_tempdir("gm-failover-")
    # two replicas a primary: the one left still confirms writes after the other takes over
    with EmbeddedCluster(directory, replicas=2, node_timeout_ms=1_000) as cluster:
        settings = settings_for(cluster, durability)
        services = service_streams("gm", PARTITIONS)
        victim = victim_of(cluster, services)
        replicas = cluster.replicas_of(victim)
        load = Load()
        found: dict[str, Any] = {}

        async def scenario() -> None:
            async with service(settings, cluster.url) as running:
                store, client = running.store, running.client
                producers = [
                    asyncio.create_task(recorder(store, load, 300)),
                    asyncio.create_task(bridge(client, services, load, 6, 40)),
                ]
                # Given the load is going, and the victim's replicas fall behind
                await until(lambda: len(load.acknowledged) >= 60, "the first turns")
                stopped = await asyncio.to_thread(open_a_replication_gap, cluster, victim)
                before, loop = len(load.acknowledged), asyncio.get_running_loop()
                await until(  # "none" acknowledges turns behind the gap; "replica" waits
                    lambda: len(load.acknowledged) >= before + 30 or load.stalled(loop.time(), 1.0),
                    "turns behind the gap",
                )
                # When the primary is SIGKILLed and its replicas resume
                [node] = [n for n in cluster.nodes if n.port == victim]
                assert node.pid is not None
                os.kill(node.pid, signal.SIGKILL)
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
                await until(
                    lambda: any(role(cluster, r) == "master" for r in replicas),
                    "a replica taking over",
                )
                await asyncio.gather(*producers)
                alive(running.worker)
                # Then no acknowledged turn is lost (durability = replica), none doubled
                found["lost"] = await check_recorded(store, load)
                answered, found["repeats"] = await settle(client, services, load)
                found["answered"] = answered
                found["stuck"] = await still_queued(client, services, posted_names(load) - answered)
                for (uuid, channel), posted in load.posted.items():
                    texts = await stored_texts(store, uuid, channel)
                    assert len(texts) == len(set(texts)), "a service turn stored twice"
                    if durability != "replica":
                        continue
                    for entry, text in posted:  # a published reply: both its turns are kept
                        if named(uuid, entry) in answered:
                            assert {text, "re: " + text} <= set(texts), (uuid, channel)

        asyncio.run(asyncio.wait_for(scenario(), 4 * DEADLINE))
    lost, answered = found["lost"], found["answered"]
    posted = sum(len(v) for v in load.posted.values())
    with capsys.disabled():
        print(
            f"\n[failover] durability={durability}: {len(lost)} of {len(load.acknowledged)} "
            f"acknowledged turns lost after SIGKILL of a primary ({load.resends} resends); "
            f"{len(answered)} of {posted} posted messages answered, {found['repeats']} "
            f"replies published again, {len(found['stuck'])} unanswered still queued "
            f"({load.refused_posts} posts refused)"
        )
    if durability == "replica":
        assert not lost
        assert not found["stuck"]  # the others went with the primary (a bridge's XADD)


async def settle(
    client: Any, services: tuple[ServiceKeys, ...], load: Load
) -> tuple[set[tuple[int, str]], int]:
    """The messages answered once the worker has gone quiet (no new reply for 3 s) or
    has answered every posted one, and how many replies repeat one: outbound is
    at-least-once (a reply whose publishing no replica confirmed is published again
    when its entry is resumed; the bridge drops repeats by in_reply_to)."""
    loop = asyncio.get_running_loop()
    posted = posted_names(load)
    names: list[tuple[int, str]] = []
    quiet_since = loop.time()
    while loop.time() - quiet_since < 3.0 and not posted <= set(names):
        now = answered_names(await outbound(client, services))
        if now != names:
            names, quiet_since = now, loop.time()
        await asyncio.sleep(0.1)  # polling the worker's progress, with a deadline
    return set(names) & posted, len(names) - len(set(names))


async def still_queued(
    client: Any, services: tuple[ServiceKeys, ...], names: set[tuple[int, str]]
) -> set[tuple[int, str]]:
    """Of these unanswered messages, those still in their inbound stream (the others
    went with the killed primary: the bridge's XADD waits for no replica)."""
    queued = set()
    for partition, entry in names:
        if await client.xrange(services[partition].inbound, entry, entry):
            queued.add((partition, entry))
    return queued
