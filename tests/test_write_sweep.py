"""Writes expire a few idle sessions of their shard (issue 13 item 5).

Keys have no TTL, so before this a store nobody swept kept expired chat in Redis
forever: context() returned nothing after the 30 minutes, but the text stayed in
the transcript key until a sweep() that a library user might never call. Now every
record() expires up to WRITE_SWEEP_BATCH other sessions of its shard that are idle
past their TTL, in the same script, with the same events and byte accounting as a
sweep. These tests use a store only through record() and context().
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis as redis_py

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem.keys import KeySpace
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import Event
from gridmem.scripts import WRITE_SWEEP_BATCH
from tests.helpers import avatar
from tests.helpers import dump_all
from tests.helpers import recompute

PUBLIC_TTL = CHANNEL_TTL_MS[Channel.PUBLIC]
WRITER = avatar(9_999)


def _secret(n: int, channel: str) -> str:
    return f"expired-secret-{channel}-{n}-swordfish"


def _talk(store: ConversationStore, n: int, channel: str) -> None:
    store.record(avatar(n), channel, AvatarMessage(text=_secret(n, channel)))
    store.record(avatar(n), channel, AgentReply(text=f"reply to {n}"))


def _expired(store: ConversationStore, after: str | None = None) -> list[Event]:
    return [
        e
        for e in store.events(after=after, count=1000)
        if e.reason is ReasonCode.EXPIRED_INACTIVITY
    ]


def test_writes_alone_leave_no_expired_text_in_redis(
    store: ConversationStore, clock: ManualClock, redis: redis_py.Redis
) -> None:
    # Given 6 public and 3 IM conversations, then a day of silence (both TTLs pass)
    for n in range(6):
        _talk(store, n, "public")
    for n in range(3):
        _talk(store, n, "im")
    assert _secret(0, "public") in dump_all(redis)  # the dump does see stored text
    clock.advance(CHANNEL_TTL_MS[Channel.IM])
    # When the store is used only through context() and record(), never sweep()
    assert store.context(avatar(0), "public") == []
    for turn in range(-(-9 // WRITE_SWEEP_BATCH)):  # enough writes for 9 victims
        store.record(WRITER, "public", AvatarMessage(text=f"hello {turn}"))
        store.context(WRITER, "public")
    # Then no expired session's text, nor any of its keys, is left in Redis
    dump = dump_all(redis)
    for n in range(6):
        assert _secret(n, "public") not in dump
        assert f"reply to {n}" not in dump
    for n in range(3):
        assert _secret(n, "im") not in dump
    state = recompute(redis)
    assert set(state["sessions"]) == state["indexed"] == state["lru"] == {f"{WRITER}:public"}
    assert len(_expired(store)) == 9


def test_write_time_expiry_keeps_events_and_byte_totals_exact(
    store: ConversationStore, clock: ManualClock, redis: redis_py.Redis
) -> None:
    # Given three sessions of known size
    for n in range(3):
        _talk(store, n, "public")
    sizes = {
        m.avatar_uuid: (m.session_id, m.turn_count, m.byte_count)
        for m in store.list_metadata().items
    }
    clock.advance(PUBLIC_TTL)
    # When one write expires them all
    receipt = store.record(WRITER, "public", AvatarMessage(text="anyone here?"))
    # Then each has one expired_inactivity event with its own turns and bytes
    events = _expired(store)
    ended = {e.avatar_uuid: (e.session_id, e.detail["turns"], e.detail["bytes"]) for e in events}
    assert ended == sizes
    # and the shard's byte total is exactly what the writer's session holds
    [left] = store.list_metadata().items
    assert left.session_id == receipt.session_id
    state = recompute(redis)
    assert state["stats_bytes"] == left.byte_count == store.stats().stored_bytes
    assert state["stats_bytes"] == sum(s["bytes"] for s in state["sessions"].values())
    assert store.stats().events[ReasonCode.EXPIRED_INACTIVITY] == 3


def test_one_write_expires_at_most_the_batch(
    store: ConversationStore, clock: ManualClock, redis: redis_py.Redis
) -> None:
    # Given more expired sessions than a few writes' batches
    victims = 2 * WRITE_SWEEP_BATCH + 1
    for n in range(victims):
        store.record(avatar(n), "public", AvatarMessage(text=_secret(n, "public")))
    clock.advance(PUBLIC_TTL)
    # When one resident writes, then writes again, and again
    swept = []
    after = None
    for turn in range(4):
        store.record(WRITER, "public", AvatarMessage(text=f"turn {turn}"))
        events = store.events(after=after, count=1000)
        after = events[-1].id if events else after
        swept.append(len([e for e in events if e.reason is ReasonCode.EXPIRED_INACTIVITY]))
    # Then each write expired a full batch while there was one, and never more
    assert swept == [WRITE_SWEEP_BATCH, WRITE_SWEEP_BATCH, 1, 0]
    # oldest activity first: ties by member order, as the LRU index sorts them
    ended = [e.avatar_uuid for e in _expired(store)]
    assert ended == sorted(avatar(n) for n in range(victims))
    assert len(recompute(redis)["sessions"]) == 1


def test_own_expired_session_is_handled_as_before_plus_the_batch(
    store: ConversationStore, clock: ManualClock
) -> None:
    """The session written to ends itself (as before) and does not use up the batch."""
    store.record(WRITER, "public", AvatarMessage(text="first"))
    for n in range(WRITE_SWEEP_BATCH + 2):
        store.record(avatar(n), "public", AvatarMessage(text="hi"))
    clock.advance(PUBLIC_TTL)
    receipt = store.record(WRITER, "public", AvatarMessage(text="back again"))
    assert receipt.new_session
    expired = Counter(e.avatar_uuid == WRITER for e in _expired(store))
    assert expired == {True: 1, False: WRITE_SWEEP_BATCH}
    assert [m.content for m in store.context(WRITER, "public")] == ["back again"]


def test_expiry_at_exactly_the_ttl_is_respected(
    store: ConversationStore, clock: ManualClock, redis: redis_py.Redis
) -> None:
    # Given a session whose only turn was at t0
    store.record(avatar(1), "public", AvatarMessage(text=_secret(1, "public")))
    # When another resident writes at 29:59.999, it is alive and keeps its text
    clock.advance(PUBLIC_TTL - 1)
    store.record(WRITER, "public", AvatarMessage(text="early"))
    assert _expired(store) == []
    assert _secret(1, "public") in dump_all(redis)
    assert [m.content for m in store.context(avatar(1), "public")] == [_secret(1, "public")]
    # When the next write comes at 30:00.000, it is expired and its text is gone
    clock.advance(1)
    store.record(WRITER, "public", AvatarMessage(text="on time"))
    assert [e.avatar_uuid for e in _expired(store)] == [avatar(1)]
    assert _secret(1, "public") not in dump_all(redis)


def test_a_write_sweeps_its_own_shard_only(
    make_store: Callable[..., ConversationStore], clock: ManualClock, redis: redis_py.Redis
) -> None:
    """A script touches one hash tag (one cluster slot): the other shard waits for its
    own writes, or for sweep()."""
    store = make_store(ConversationConfig(shards=2))
    space = KeySpace("gm", 2)
    by_shard: dict[int, list[str]] = {0: [], 1: []}
    for n in range(40):
        uuid = avatar(n)
        if len(by_shard[space.shard_of(uuid)]) < 2:
            by_shard[space.shard_of(uuid)].append(uuid)
    for uuid in by_shard[0] + by_shard[1]:
        store.record(uuid, "public", AvatarMessage(text=f"words of {uuid}"))
    clock.advance(PUBLIC_TTL)
    writer = next(avatar(n) for n in range(100, 200) if space.shard_of(avatar(n)) == 0)
    store.record(writer, "public", AvatarMessage(text="hi"))
    dump = dump_all(redis)
    assert all(f"words of {uuid}" not in dump for uuid in by_shard[0])
    assert all(f"words of {uuid}" in dump for uuid in by_shard[1])
    assert store.sweep() == 2
    assert all(f"words of {uuid}" not in dump_all(redis) for uuid in by_shard[1])


@pytest.mark.parametrize("channel", [Channel.PUBLIC, Channel.IM])
def test_live_sessions_are_never_swept_by_writes(
    store: ConversationStore, clock: ManualClock, channel: Channel
) -> None:
    """Only sessions idle past their own channel's TTL go: an IM conversation quiet for
    30 minutes stays, whatever the writes around it."""
    store.record(avatar(1), channel, AvatarMessage(text="still talking"))
    clock.advance(CHANNEL_TTL_MS[channel] - 1)
    for turn in range(3):
        store.record(WRITER, "public", AvatarMessage(text=f"turn {turn}"))
    assert [m.content for m in store.context(avatar(1), channel)] == ["still talking"]
    assert _expired(store) == []
