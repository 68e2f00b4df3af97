"""Events: stable reason codes and counts in a stream bounded exactly; never content."""

from __future__ import annotations

from typing import Any

import pytest

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Event
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem.records import CHANNEL_TTL_MS
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

WORDS = "plum-saxophone-marker"


def test_reason_codes_are_stable() -> None:
    required = {
        "expired_inactivity", "expired_operator", "deleted_operator", "compacted",
        "summary_trimmed", "evicted_session_limit", "evicted_aggregate_bytes",
        "snapshot_quarantined", "snapshot_restored", "permissions_not_verified",
    }  # fmt: skip
    assert required <= {code.value for code in ReasonCode}
    for code in ReasonCode:
        assert code.name == code.value.upper() and ReasonCode(code.value) is code


def _produce_events(store: ConversationStore, clock: ManualClock, n: int) -> None:
    for i in range(n):
        a = avatar(i)
        store.record(a, "public", AvatarMessage(text=f"{WORDS} {i}"))
        store.record(a, "im", AvatarMessage(text=f"{WORDS} {i}"))
        store.delete(a, "public")
        store.expire(a, "im")


def test_events_carry_metadata_never_content(store: ConversationStore, clock: ManualClock) -> None:
    first = store.record(avatar(99), "public", AvatarMessage(text=f"{WORDS} expiring"))
    clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC])
    store.record(avatar(99), "public", AvatarMessage(text=f"{WORDS} again"))
    _produce_events(store, clock, 3)
    events = store.events()
    assert [e.reason for e in events] == [ReasonCode.EXPIRED_INACTIVITY] + [
        ReasonCode.DELETED_OPERATOR,
        ReasonCode.EXPIRED_OPERATOR,
    ] * 3
    assert events[0].session_id == first.session_id
    assert events[0].avatar_uuid == avatar(99) and events[0].channel is Channel.PUBLIC
    for event in events:
        dumped = event.model_dump_json()
        assert WORDS not in dumped
        assert set(event.detail) == {"turns", "bytes"}
        assert event.at_ms == clock.wall_ms()


def test_stream_is_bounded_exactly(make_store: Any, redis: Any, clock: ManualClock) -> None:
    store: ConversationStore = make_store(ConversationConfig(limits=Limits(max_events=5)))
    _produce_events(store, clock, 10)  # 20 events
    assert redis.xlen("gm:{0}:events") == 5
    events = store.events()
    assert len(events) == 5
    assert [e.avatar_uuid for e in events][-1] == avatar(9)


def test_follow_with_after(store: ConversationStore, clock: ManualClock) -> None:
    _produce_events(store, clock, 5)  # 10 events
    seen: list[Event] = []
    after = None
    while batch := store.events(after=after, count=3):
        seen.extend(batch)
        after = batch[-1].id
    assert len(seen) == 10 and len({e.id for e in seen}) == 10
    _produce_events(store, clock, 1)
    assert [e.reason for e in store.events(after=after)] == [
        ReasonCode.DELETED_OPERATOR,
        ReasonCode.EXPIRED_OPERATOR,
    ]


@pytest.mark.parametrize("count", [1, 4, 100])
def test_follow_across_shards(redis: Any, clock: ManualClock, count: int) -> None:
    store = ConversationStore(redis, ConversationConfig(shards=3), clock=clock)
    _produce_events(store, clock, 12)  # 24 events over 3 shards
    seen: list[Event] = []
    after = None
    while batch := store.events(after=after, count=count):
        seen.extend(batch)
        after = batch[-1].id
    assert len(seen) == 24
    assert sorted((e.avatar_uuid, e.reason) for e in seen) == sorted(
        (avatar(i), r)
        for i in range(12)
        for r in (ReasonCode.DELETED_OPERATOR, ReasonCode.EXPIRED_OPERATOR)
    )
