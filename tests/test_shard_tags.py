"""Shard hash tags spread over the Redis Cluster slots (gridmem.keys.shard_tags).

The slots here come from the test's own CRC16 (XMODEM, bit by bit, as the Redis
Cluster specification gives it), never from the code under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem.keys import KeySpace
from gridmem.keys import shard_tags
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.replies import ReadCall
from gridmem.replies import ScriptCall
from tests.helpers import avatar

SLOTS = 16384


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot(key: str) -> int:
    """A key's slot: of its hash tag (the first non-empty {...}) if it has one."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key.encode()) % SLOTS


def candidates(shard: int) -> Iterator[str]:
    """The documented search order of shard i's tag: i, i-1, i-2, ..."""
    yield str(shard)
    n = 1
    while True:
        yield f"{shard}-{n}"
        n += 1


def test_crc16_is_the_cluster_one() -> None:
    """The specification's check values: the test's CRC is the one Redis uses."""
    assert crc16(b"123456789") == 0x31C3
    assert slot("foo") == 12182 and slot("{user1000}.following") == slot("user1000")


def test_one_shard_keeps_tag_0() -> None:
    """Existing single-shard key names (gm:{0}:...) stay as they were."""
    assert shard_tags(1) == ("0",)
    assert KeySpace("gm", 1).shard(0).sessions == "gm:{0}:sessions"


@pytest.mark.parametrize("shards", [2, 3, 7, 16, 100, 1024])
def test_each_tag_is_the_first_candidate_in_its_slot_range(shards: int) -> None:
    tags = shard_tags(shards)
    assert len(tags) == shards == len(set(tags))
    for i, tag in enumerate(tags):
        low, high = i * SLOTS // shards, (i + 1) * SLOTS // shards
        assert low <= slot(tag) < high, (i, tag)
        if shards <= 100:  # the rule itself: no earlier candidate lies in the range
            for earlier in candidates(i):
                if earlier == tag:
                    break
                assert not low <= slot(earlier) < high, (i, earlier)


def test_sixteen_shards_fill_three_equal_slot_ranges_evenly() -> None:
    """What a 3-primary cluster with equal ranges owns: 5 or 6 shards each."""
    ranges = [(0, 5461), (5461, 10923), (10923, SLOTS)]  # valkey-cli --cluster create's split
    owned = [sum(low <= slot(t) < high for t in shard_tags(16)) for low, high in ranges]
    assert sorted(owned) == [5, 5, 6]


@pytest.mark.parametrize("shards", [1, 16])
def test_a_session_and_its_shard_share_one_slot(shards: int) -> None:
    space = KeySpace("gm", shards)
    for n in range(64):
        session, shard = space.session(avatar(n), Channel.IM)
        keys = [*session.all(), shard.lru_public, shard.lru_im, shard.sessions, shard.seq]
        keys += [shard.clock, shard.events, shard.stats, shard.restored, shard.limits]
        assert {slot(k) for k in keys} == {slot("{" + space.tags[shard.shard] + "}")}


class _SlotWatch:
    """Every call a store sends, with the slots of the keys it names."""

    def __init__(self, store: ConversationStore) -> None:
        self.slots: list[set[int]] = []
        original = store.executor.call

        def watching(call: Any) -> Any:
            if isinstance(call, ScriptCall):
                self.slots.append({slot(k) for k in call.keys})
            elif isinstance(call, ReadCall):
                self.slots.append({slot(str(c[1])) for c in call.commands})
            return original(call)

        store.executor.call = watching  # type: ignore[method-assign]


def test_every_call_of_a_sharded_store_stays_in_one_slot() -> None:
    """Given a 16-shard store, when every kind of call runs, each names one slot only."""
    limits = Limits(max_active_sessions=64, max_turns_per_session=4)
    store = ConversationStore(
        fakeredis.FakeRedis(server=fakeredis.FakeServer()),
        ConversationConfig(shards=16, limits=limits),
        clock=ManualClock(),
    )
    watch = _SlotWatch(store)
    for n in range(80):  # past the session bound (evictions) and the turn bound (compaction)
        for text in ("hi", "more", "again"):
            store.record(avatar(n % 70), Channel.IM, AvatarMessage(text=text))
        store.record(avatar(n % 70), Channel.PUBLIC, AgentReply(text="ok"))
        store.context(avatar(n), Channel.IM)
    store.read_page(avatar(1), Channel.IM)
    store.list_metadata(limit=200)
    store.events(count=500)
    store.stats()
    store.sweep()
    store.delete(avatar(2), Channel.IM)
    assert len(watch.slots) > 400
    assert all(len(slots) == 1 for slots in watch.slots)
    used = set().union(*watch.slots) - {slot("gm:layout")}  # the layout: one key of its own
    assert used == {slot("{" + t + "}") for t in shard_tags(16)}
