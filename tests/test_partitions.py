"""Partitioned service streams (issue 15): the documented partition of an avatar, each
partition's keys in one cluster slot, and a worker answering every partition.

The expected partition is computed here from the formula docs/streams.md gives
(zlib.crc32 of the lowercase UUID), and the expected slot with redis-py's own
cluster hashing (redis.crc.key_slot, what CLUSTER KEYSLOT answers), never from
the code under test.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import signal
import sys
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from redis.crc import key_slot

from gridmem import ConversationConfig
from gridmem import connect_cluster_async
from gridmem import partition_of
from gridmem import service_streams
from gridmem.clock import ManualClock
from gridmem.config import Settings
from gridmem.errors import InvalidAvatarId
from gridmem.keys import KeySpace
from gridmem.keys import ServiceKeys
from gridmem.partitions import CLUSTER_SLOTS
from gridmem.partitions import partition_tags
from gridmem.store import AsyncConversationStore
from gridmem.store import async_client_for
from gridmem.stream_calls import OutboundReply
from tests.conftest import flush_cluster
from tests.conftest import short_tempdir
from tests.helpers import avatar
from tests.test_cluster import node_keys
from tests.test_cluster import node_of_slot
from tests.test_worker import DEADLINE
from tests.test_worker import go
from tests.test_worker import new_client
from tests.test_worker import watch
from worker.llm import Message
from worker.localllm import LocalChatServer

__all__ = ["new_client"]  # the fixture, used by the worker test below

DOC_EXAMPLE = "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90"  # docs/streams.md's worked example


def expected_partition(uuid: str, partitions: int) -> int:
    return zlib.crc32(uuid.lower().encode("utf-8")) % partitions


def test_the_partition_is_the_documented_crc32_of_the_lowercase_uuid() -> None:
    assert zlib.crc32(DOC_EXAMPLE.encode()) == 4213392405  # the number docs/streams.md shows
    assert partition_of(DOC_EXAMPLE, 4) == 1 == partition_of(DOC_EXAMPLE.upper(), 4)
    for n in range(200):
        for partitions in (1, 2, 3, 4, 16, 256):
            uuid = avatar(n)
            assert partition_of(uuid, partitions) == expected_partition(uuid, partitions)
    assert {partition_of(avatar(n), 4) for n in range(40)} == {0, 1, 2, 3}
    with pytest.raises(InvalidAvatarId):
        partition_of("not-a-uuid", 4)
    with pytest.raises(ValueError, match="partitions"):
        partition_of(DOC_EXAMPLE, 0)


def test_one_partition_keeps_every_name_bridges_use() -> None:
    [keys] = service_streams("gm", 1)
    assert (keys.inbound, keys.outbound, keys.dead) == ("gm:inbound", "gm:outbound", "gm:dead")
    assert (keys.ready, keys.attempts, keys.rejected) == (
        "{gm:inbound}:ready",
        "{gm:inbound}:attempts",
        "{gm:inbound}:rejected",
    )
    assert ConversationConfig().partitions == 1


@pytest.mark.parametrize("partitions", [2, 3, 4, 16, 256])
def test_each_partition_is_one_slot_and_the_partitions_spread_over_the_slots(
    partitions: int,
) -> None:
    services = service_streams("gm", partitions)
    slots = []
    for p, keys in enumerate(services):
        names = [keys.inbound, keys.outbound, keys.dead, keys.ready, keys.attempts, keys.rejected]
        # mailboxes and leases are named in Lua from the ready set's prefix (lib.lua)
        prefix = keys.ready.removesuffix("ready")
        names += [f"{prefix}mbox:{avatar(1)}:im", f"{prefix}owner:{avatar(1)}:im"]
        assert all(name.startswith("gm:{") for name in names)  # an ACL of ~gm:* covers them
        [slot] = {key_slot(name.encode()) for name in names}
        # partition p sits in the p-th equal share of the slots
        assert p * CLUSTER_SLOTS // partitions <= slot < (p + 1) * CLUSTER_SLOTS // partitions + 1
        slots.append(slot)
    assert slots == sorted(slots) and len(set(slots)) == partitions
    # on the three masters valkey-cli --cluster create makes, each gets its share (+-1)
    masters = [sum(1 for s in slots if lo <= s <= hi) for lo, hi in THREE_MASTERS]
    assert max(masters) - min(masters) <= 1, masters


THREE_MASTERS = [(0, 5460), (5461, 10922), (10923, 16383)]


def test_the_stream_contract_names_the_keys_of_four_partitions() -> None:
    """docs/streams.md's table for P = 4 is what the service uses: tags, slots, names."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "streams.md").read_text()
    rows = re.findall(
        r"^\| (\d) \| `(p[\d.]+)` \((\d+)\) \| `(\S+)` \| `(\S+)` \| `(\S+)` \|$",
        doc,
        re.MULTILINE,
    )
    assert rows == [
        (str(k.partition), tag, str(key_slot(k.inbound.encode())), k.inbound, k.outbound, k.dead)
        for k, tag in zip(service_streams("gm", 4), partition_tags(4), strict=True)
    ]


class HeldChat:
    """Answers "re: <text>" once `release` is set, keeping every request whole; holds
    each call until then, so the test can look at the queue's keys mid-run."""

    name = "held"

    def __init__(self) -> None:
        self.requests: list[list[Message]] = []
        self.release = asyncio.Event()
        self.changed = asyncio.Condition()

    async def complete(self, messages: list[Message]) -> str:
        async with self.changed:
            self.requests.append(messages)
            self.changed.notify_all()
        await self.release.wait()
        return "re: " + [m["content"] for m in messages if m["role"] == "user"][-1]

    async def aclose(self) -> None:
        return None


class HeldRun:
    """A worker over a HeldChat, started by start(); leaving its block releases the
    model, stops the worker, waits for it and closes its store and the bridge's client."""

    def __init__(
        self, store: AsyncConversationStore, client: Any, settings: Settings, name: str
    ) -> None:
        from worker.service import Worker

        self.store, self.client = store, client
        self.chat = HeldChat()
        self.worker = Worker(store, self.chat, settings, name=name)
        self.written = watch(store)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.worker.run())

    async def __aenter__(self) -> HeldRun:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.chat.release.set()
        self.worker.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, DEADLINE)
        await self.store.aclose()
        await self.client.aclose()


PARTITIONS = 4


Sent = dict[tuple[str, str], list[str]]  # (avatar UUID, channel) -> entry IDs, as posted


def message(who: int, channel: str, n: int) -> dict[str, str]:
    return {"avatar_uuid": avatar(who), "channel": channel, "text": f"{who}/{channel}/{n}"}


def check_answers(sent: Sent, replies: dict[int, list[dict[str, str]]], partitions: int) -> None:
    """Each message answered once; a key's replies in the order posted, on the outbound
    stream of the avatar's partition (`replies`: partition -> its outbound entries)."""
    in_reply_to = [r["in_reply_to"] for rs in replies.values() for r in rs]
    assert sorted(in_reply_to) == sorted(e for ids in sent.values() for e in ids)
    for p, rs in replies.items():
        assert all(expected_partition(r["avatar_uuid"], partitions) == p for r in rs)
    for (uuid, channel), ids in sent.items():
        mine = replies[expected_partition(uuid, partitions)]
        order = [
            r["in_reply_to"] for r in mine if (r["avatar_uuid"], r["channel"]) == (uuid, channel)
        ]
        assert order == ids, (uuid, channel)


def check_requests_hold_one_key(requests: list[list[dict[str, Any]]]) -> None:
    """The wire check: every text in a request to the model is of one (avatar, channel)
    (message() texts are `<who>/<channel>/<n>`, replies quote them)."""
    for request in requests:
        said = {
            m["content"].removeprefix("re: ").rsplit("/", 1)[0]
            for m in request
            if m["role"] in ("user", "assistant")
        }
        assert len(said) == 1, said


async def post(client: Any, services: tuple[ServiceKeys, ...]) -> Sent:
    sent: Sent = {}
    for n in range(3):
        for who in range(16):
            for channel in ("public", "im"):
                fields = message(who, channel, n)
                keys = services[expected_partition(avatar(who), PARTITIONS)]
                entry = (await client.xadd(keys.inbound, fields)).decode()
                sent.setdefault((avatar(who), channel), []).append(entry)
    assert {expected_partition(u, PARTITIONS) for u, _ in sent} == set(range(PARTITIONS))
    return sent


async def keys_in_their_slots(client: Any, services: tuple[ServiceKeys, ...]) -> None:
    shard = KeySpace().prefix(0)  # the sessions' keys, not the queue's
    names = [k.decode() for k in await client.keys("gm:{*")]
    names = [name for name in names if not name.startswith(shard)]
    assert any(":mbox:" in k for k in names) and any(":owner:" in k for k in names)
    slots = {key_slot(keys.inbound.encode()): keys for keys in services}
    for name in names:
        keys = slots[key_slot(name.encode())]  # in some partition's slot...
        assert name.startswith(keys.ready.removesuffix("ready"))  # ...under its tag


async def replies(
    client: Any, services: tuple[ServiceKeys, ...], expected: int, written: asyncio.Event
) -> dict[int, Any]:
    """Every partition's outbound entries, read again each time the worker has
    written something, until `expected` are there (or the deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        written.clear()  # before reading: a write meanwhile sets it again
        found = {}
        for keys in services:
            rows = await client.xrange(keys.outbound)
            found[keys.partition] = [
                {k.decode(): v.decode() for k, v in f.items()} for _, f in rows
            ]
        if sum(len(r) for r in found.values()) >= expected:
            return found
        await asyncio.wait_for(written.wait(), deadline - loop.time())


def test_a_worker_answers_every_partition_once_in_order_on_the_avatars_partition(
    new_client: Callable[[], Any],
) -> None:
    """Every worker consumes every partition: messages of many avatars on both channels
    are each answered once, per key in the order posted, the reply on the outbound
    stream of the avatar's partition; while they wait, each partition's keys sit in its
    slot. Keys a dead worker left in any partition are adopted. An entry posted to
    another partition's stream is dead-lettered there."""
    from worker.service import GROUP

    services = service_streams("gm", PARTITIONS)

    async def scenario() -> None:
        settings = Settings(
            worker={"concurrency": 4},
            conversation={"partitions": PARTITIONS, "limits": {"max_text_bytes": 2000}},
        )
        client = new_client()
        store = AsyncConversationStore(new_client(), settings.conversation, clock=ManualClock())
        async with HeldRun(store, client, settings, "w-test") as run:
            chat = run.chat
            # Given 16 avatars x 2 channels x 3 messages, each on its avatar's partition,
            sent = await post(client, services)
            # one posted to a partition its avatar is not in,
            stray_uuid = avatar(1)
            wrong = services[(expected_partition(stray_uuid, PARTITIONS) + 1) % PARTITIONS]
            fields = {"avatar_uuid": stray_uuid, "channel": "im", "text": "stray"}
            stray = (await client.xadd(wrong.inbound, fields)).decode()
            # all of which a worker read and filed, then died (the keys have no owner
            # and nothing new comes: only the orphan adopter can find them)
            for keys in services:
                await store.executor.call(store.scripts.ensure_group(keys, group=GROUP))
                take = store.scripts.take_inbound(keys, group=GROUP, consumer="dead", count=1000)
                assert len(await store.executor.call(take)) == await client.xlen(keys.inbound)
            run.start()
            # When the model is asked (and holds): the queue's keys are in their slots
            async with chat.changed:
                held = chat.changed.wait_for(lambda: len(chat.requests) >= 4)
                await asyncio.wait_for(held, DEADLINE)
            await keys_in_their_slots(client, services)
            chat.release.set()
            # Then every message is answered once, per key in order, on its partition
            expected = sum(len(ids) for ids in sent.values())
            answers = await replies(client, services, expected, run.written)
            check_answers(sent, answers, PARTITIONS)
            check_requests_hold_one_key(chat.requests)  # type: ignore[arg-type]
            assert len(chat.requests) == expected  # the stray one never reached the model
            dead = [
                {k.decode(): v.decode() for k, v in f.items()}
                for _, f in await client.xrange(wrong.dead)
            ]
            assert dead == [{"id": stray, "reason": "wrong_partition"}]
            for keys in services:
                assert await client.xlen(keys.inbound) == 0  # answered entries are deleted

    go(scenario())


def _bridge_module() -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / "bridge.py"
    spec = importlib.util.spec_from_file_location("bridge_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_example_bridge_posts_to_the_avatars_partition_and_reads_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/bridge.py with --partitions 4: each message on its avatar's partition,
    every partition's replies shown once (an entry ID both partitions have is two
    replies, a repeat in one is dropped), resumed per partition after a restart."""
    bridge_example = _bridge_module()
    client = fakeredis.FakeRedis(decode_responses=True)
    services = service_streams("gm", PARTITIONS)
    state = tmp_path / "state.json"
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(bridge_example, "say", lambda r: shown.append((r.avatar_uuid, r.text)))

    def run_until(bridge: Any, count: int) -> None:
        def stop_when_shown(reply: Any) -> None:
            shown.append((reply.avatar_uuid, reply.text))
            if len(shown) >= count:
                bridge.stop()

        monkeypatch.setattr(bridge_example, "say", stop_when_shown)
        worker = threading.Thread(target=bridge.run, daemon=True)
        worker.start()
        worker.join(DEADLINE)
        assert not worker.is_alive(), f"{len(shown)} of {count} shown"

    # Given a bridge on 4 partitions, residents of every partition talking
    bridge = bridge_example.Bridge(client, "gm", state, PARTITIONS)
    for who in range(12):
        bridge.post(message(who, "im", 0))
    for keys in services:
        uuids = {f["avatar_uuid"] for _, f in client.xrange(keys.inbound)}
        assert uuids and all(expected_partition(u, PARTITIONS) == keys.partition for u in uuids)
    # When replies come on partitions 0 and 2 under one entry ID, and a repeat on 2
    a, b = avatar(1), avatar(2)
    reply = {"channel": "im", "in_reply_to": "5-1", "session_id": "s"}
    client.xadd(services[0].outbound, {**reply, "avatar_uuid": a, "text": "to a"}, id="7-1")
    client.xadd(services[2].outbound, {**reply, "avatar_uuid": b, "text": "to b"}, id="7-1")
    client.xadd(services[2].outbound, {**reply, "avatar_uuid": b, "text": "to b"}, id="7-2")
    client.xadd(services[3].outbound, {**reply, "avatar_uuid": a, "text": "last"}, id="8-1")
    run_until(bridge, 3)
    bridge.state.save(state)
    # Then each is shown once, the repeat dropped, and the positions resume per stream
    assert sorted(shown) == sorted([(a, "to a"), (b, "to b"), (a, "last")])
    assert json.loads(state.read_text())["last_ids"] == ["7-1", "0-0", "7-2", "8-1"]
    client.xadd(services[1].outbound, {**reply, "avatar_uuid": b, "text": "after"}, id="9-1")
    shown.clear()
    run_until(bridge_example.Bridge(client, "gm", state, PARTITIONS), 1)
    assert shown == [(b, "after")]


def _post_to_service(client: Any, services: tuple[ServiceKeys, ...]) -> set[tuple[int, str]]:
    """16 avatars x 2 channels x 3 messages in a burst, each on its avatar's partition,
    texts tagged as tests/test_service.py reads them; (partition, entry ID) of each."""
    posted = set()
    for n in range(3):
        for who in range(16):
            for channel in ("public", "im"):
                p = expected_partition(avatar(who), PARTITIONS)
                fields = {**message(who, channel, n), "text": f"msg [{who}/{channel}/{n}]"}
                posted.add((p, client.xadd(services[p].inbound, fields)))
    return posted


def _replies(client: Any, services: tuple[ServiceKeys, ...]) -> dict[int, list[dict[str, str]]]:
    return {k.partition: [f for _, f in client.xrange(k.outbound)] for k in services}


@pytest.mark.real
@pytest.mark.slow
def test_gridmem_serve_on_four_partitions_survives_a_sigkill_exactly_once() -> None:
    """`gridmem serve` with partitions = 4, two worker processes, both SIGKILLed mid-run:
    every message of 16 avatars x 2 channels is stored once and answered, per key in the
    order posted, each reply on its avatar's partition; no request to the model mixes
    keys; every key the queue left sits in its partition's slot."""
    from tests.test_service import TAG
    from tests.test_service import _assert_exactly_once
    from tests.test_service import _start
    from tests.test_service import _stop
    from tests.test_service import wait_until

    services = service_streams("gm", PARTITIONS)
    base = short_tempdir("gm-part-")
    sent = {(who, ch): [0, 1, 2] for who in range(16) for ch in ("public", "im")}
    try:
        with LocalChatServer(delay_seconds=0.2) as llm:
            service = _start(base, llm, partitions=PARTITIONS, concurrency=4)
            try:
                # Given messages of every partition, in a burst
                posted = _post_to_service(service.client, services)
                # When both workers are SIGKILLed while work is in flight (between them
                # they hold keys of every partition: one alone may hold one partition's)
                wait_until(service.process, lambda: len(llm.requests) >= 10, "work in flight", 60)
                for victim in service.workers():
                    victim.send_signal(signal.SIGKILL)

                # Then every message is answered, on its avatar's partition (entry IDs
                # are per stream: a reply is named by its partition and in_reply_to)
                def answered() -> bool:
                    replies = _replies(service.client, services).items()
                    return posted <= {(p, r["in_reply_to"]) for p, rs in replies for r in rs}

                wait_until(service.process, answered, "every message answered", 90)
                for p, replies in _replies(service.client, services).items():
                    assert all(
                        expected_partition(r["avatar_uuid"], PARTITIONS) == p for r in replies
                    )
                _assert_exactly_once(service, sent)  # stored once each, in the order posted
                wait_until(
                    service.process,
                    lambda: all(service.client.xlen(k.inbound) == 0 for k in services),
                    "the answered entries to be deleted",
                    30,
                )
                shard = KeySpace().prefix(0)
                slots = {key_slot(k.inbound.encode()): k for k in services}
                for name in service.client.keys("gm:{*"):
                    if not name.startswith(shard):
                        keys = slots[key_slot(name.encode())]
                        assert name.startswith(keys.ready.removesuffix("ready")), name
            finally:
                _stop(service)
        for body in llm.requests:  # the wire check: one key per request
            found = {(w, c) for m in body["messages"][1:] for w, c, _ in TAG.findall(m["content"])}
            assert len(found) == 1, found
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.real
@pytest.mark.slow
def test_every_step_of_the_queue_runs_on_a_real_cluster_and_partitions_spread() -> None:
    """On a real 3-master Valkey Cluster, each step of the queue (group, XADD, take,
    claim, attempt, renew, publish, dead letter, finish, orphans, backlog, blocking read)
    runs against each of 4 partitions without a cross-slot error, and 16 partitions put
    5 or 6 on each master. (The worker itself on a cluster: the test after this one.)"""
    from gridmem.embedded import EmbeddedCluster
    from gridmem.executor import Executor
    from gridmem.scripts import Scripts
    from gridmem.scripts import load_scripts

    directory = short_tempdir("gm-cluster-")
    try:
        with EmbeddedCluster(directory, replicas=0) as cluster:
            client = cluster.client()
            executor, scripts = Executor(client), Scripts(load_scripts())
            services = service_streams("gm", PARTITIONS)
            masters = {}
            for keys in services:
                masters[keys.partition] = client.get_node_from_key(keys.inbound).port
                _one_of_each_step(client, executor, scripts, keys)
            assert len(set(masters.values())) == 3  # 4 partitions on all 3 masters
            spread = Counter(
                client.get_node_from_key(k.inbound).port for k in service_streams("gm", 16)
            )
            assert sorted(spread.values()) == [5, 5, 6], spread
            client.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _one_of_each_step(client: Any, executor: Any, scripts: Any, keys: ServiceKeys) -> None:
    uuid = next(
        avatar(n) for n in range(100) if expected_partition(avatar(n), PARTITIONS) == keys.partition
    )
    executor.call(scripts.ensure_group(keys, group="workers"))
    ids = [
        client.xadd(keys.inbound, {"avatar_uuid": uuid, "channel": "im", "text": "hi"})
        for _ in range(2)
    ]
    ids.append(client.xadd(keys.inbound, {"avatar_uuid": "bad", "channel": "im", "text": "x"}))
    assert executor.call(scripts.read_backlog(keys)) == 3
    assert client.xread({keys.inbound: "0-0"}, block=10)  # the worker's blocking read
    taken = executor.call(scripts.take_inbound(keys, group="workers", consumer="c", count=10))
    assert [t.entry_id.encode() for t in taken] == ids
    assert {t.member for t in taken} >= {f"{uuid}:im"}
    assert sorted(executor.call(scripts.orphaned_keys(keys, sample=10))) == sorted(
        {t.member for t in taken}
    )
    for member in sorted({t.member for t in taken}):
        step = executor.call(scripts.claim_key(keys, member=member, owner="c", lease_ms=5000))
        while step.state == "ok":
            attempt = scripts.begin_attempt(
                keys,
                member=member,
                owner="c",
                entry_id=step.entry_id,
                token=f"t{step.entry_id.replace('-', '')}",
            )
            count = executor.call(attempt)
            assert count.state == "ok"
            assert executor.call(scripts.renew_lease(keys, member=member, owner="c", lease_ms=5000))
            reply = None
            if step.rejected:
                executor.call(
                    scripts.dead_letter(
                        keys, entry_id=step.entry_id, reason=step.rejected, max_entries=10
                    )
                )
            else:
                assert dict(count.fields)[b"avatar_uuid"] == uuid.encode()
                # a partition's outbound stream is in its slot: published as it finishes
                reply = OutboundReply(uuid, "im", "ok", step.entry_id, "ab" * 16)
            finish = scripts.finish_entry(
                keys,
                group="workers",
                entry_id=step.entry_id,
                member=member,
                owner="c",
                lease_ms=5000,
                release=False,
                reply=reply,
                max_replies=10,
            )
            step = executor.call(finish)
    assert (client.xlen(keys.inbound), client.xlen(keys.outbound), client.xlen(keys.dead)) == (
        0,
        2,
        1,
    )


CLUSTER_AVATARS, CLUSTER_SHARDS = 40, 6


def keys_by_primary(cluster: Any, owners: dict[int, int]) -> dict[int, list[str]]:
    """What each primary holds, each key checked to be on the owner of its slot."""
    found = {port: node_keys(cluster, port) for port in cluster.primaries()}
    for port, names in found.items():
        misplaced = [name for name in names if owners[key_slot(name.encode())] != port]
        assert not misplaced, (port, misplaced)
    return found


def queue_keys_on_their_primaries(
    cluster: Any, owners: dict[int, int], services: tuple[ServiceKeys, ...]
) -> None:
    """Every key of the queue (streams, mailboxes, leases) on its slot's primary,
    under the tag of the partition whose slot it is in; the partitions on 3 primaries."""
    queue = [
        name
        for names in keys_by_primary(cluster, owners).values()
        for name in names
        if name.startswith("gm:{p")
    ]
    assert any(":mbox:" in k for k in queue) and any(":owner:" in k for k in queue)
    tags = {key_slot(k.inbound.encode()): k.ready.removesuffix("ready") for k in services}
    assert all(name.startswith(tags[key_slot(name.encode())]) for name in queue)
    assert len({owners[slot] for slot in tags}) == 3


async def post_each_key(
    client: Any, services: tuple[ServiceKeys, ...], avatars: int, messages: int
) -> Sent:
    """`messages` per avatar and channel, each on its avatar's partition, in rounds."""
    sent: Sent = {}
    for n in range(messages):
        for who in range(avatars):
            for channel in ("public", "im"):
                keys = services[expected_partition(avatar(who), PARTITIONS)]
                entry = await client.xadd(keys.inbound, message(who, channel, n))
                sent.setdefault((avatar(who), channel), []).append(entry.decode())
    by_partition = Counter(expected_partition(u, PARTITIONS) for u, _ in sent)
    assert sorted(by_partition) == list(range(PARTITIONS)), by_partition
    return sent


@pytest.mark.real
def test_the_service_on_a_real_cluster_answers_every_message_once_in_order(
    real_cluster: Any,
) -> None:
    """The worker on a real 3-primary, 3-replica Valkey Cluster, through the client
    `[redis] cluster = true` builds (as `gridmem serve` does), partitions = 4 and
    shards = 6: 40 avatars x 2 channels x 2 messages are each answered once, per key in
    the order posted, on the avatar's partition; no request to the model mixes keys;
    while the model holds, each partition's queue keys sit on the primary that owns
    their slot (CLUSTER SLOTS), and afterwards the sessions too, spread over all three."""

    flush_cluster(real_cluster)
    services = service_streams("gm", PARTITIONS)
    owners = node_of_slot(real_cluster)  # slot -> port of its primary, as the nodes say
    settings = Settings(
        redis={"url": real_cluster.url, "cluster": True},
        worker={"concurrency": 8},
        conversation={"partitions": PARTITIONS, "shards": CLUSTER_SHARDS},
    )

    async def scenario() -> Sent:
        client = connect_cluster_async(real_cluster.url)
        store = AsyncConversationStore(
            async_client_for(settings.redis, real_cluster.url),
            settings.conversation,
            clock=ManualClock(),
        )
        async with HeldRun(store, client, settings, "w-cluster") as run:
            chat = run.chat
            # Given 40 avatars x 2 channels x 2 messages, each on its avatar's partition
            sent = await post_each_key(client, services, CLUSTER_AVATARS, 2)
            # When a worker answers them (the model holding its first calls)
            run.start()
            async with chat.changed:
                held = chat.changed.wait_for(lambda: len(chat.requests) >= 4)
                await asyncio.wait_for(held, DEADLINE)
            # Then, mid-run, every queue key is on its slot's primary, under its tag
            queue_keys_on_their_primaries(real_cluster, owners, services)
            chat.release.set()
            # and every message is answered once, per key in order, on its partition
            expected = sum(len(ids) for ids in sent.values())
            check_answers(sent, await replies(client, services, expected, run.written), PARTITIONS)
            check_requests_hold_one_key(chat.requests)
            assert len(chat.requests) == expected
            for keys in services:
                assert await client.xlen(keys.inbound) == 0  # answered entries are deleted
            return sent

    sent = asyncio.run(asyncio.wait_for(scenario(), 3 * DEADLINE))
    # and each session lives on its slot's primary, all three holding some
    held = keys_by_primary(real_cluster, owners)
    meta = {port: [k for k in names if k.endswith(":meta")] for port, names in held.items()}
    assert sum(len(m) for m in meta.values()) == len(sent)
    assert all(meta.values()), {port: len(m) for port, m in meta.items()}
