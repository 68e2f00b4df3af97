"""Sessions expire after exactly their channel's TTL of inactivity (DESIGN section 4)."""

from __future__ import annotations

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem.records import CHANNEL_TTL_MS
from gridmem.scripts import WRITE_SWEEP_BATCH
from tests.helpers import all_keys
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

A = avatar(1)


@pytest.mark.parametrize(
    ("channel", "ttl"), [(Channel.PUBLIC, 1_800_000), (Channel.IM, 86_400_000)]
)
def test_alive_one_ms_before_ttl_and_expired_at_ttl(
    store: ConversationStore, clock: ManualClock, channel: Channel, ttl: int
) -> None:
    # Given a session whose last turn was at t0
    first = store.record(A, channel, AvatarMessage(text="remember the sandbox"))
    # When ttl - 1 ms pass, the session is still alive and keeps its ID
    clock.advance(ttl - 1)
    assert [m.content for m in store.context(A, channel)] == ["remember the sandbox"]
    second = store.record(A, channel, AvatarMessage(text="still here"))
    assert second.session_id == first.session_id and not second.new_session
    # When exactly ttl ms pass after that turn, it is expired
    clock.advance(ttl)
    assert store.context(A, channel) == []
    third = store.record(A, channel, AvatarMessage(text="new start"))
    # Then the next turn opens a new session that holds nothing of the old one
    assert third.new_session and third.session_id not in {first.session_id, second.session_id}
    assert [m.content for m in store.context(A, channel)] == ["new start"]
    events = [e for e in store.events() if e.reason is ReasonCode.EXPIRED_INACTIVITY]
    assert [(e.session_id, e.detail["turns"]) for e in events] == [(first.session_id, 2)]


def test_reads_never_count_as_activity(store: ConversationStore, clock: ManualClock) -> None:
    store.record(A, "public", AvatarMessage(text="hello"))
    # Given reads every minute for the whole TTL
    for _ in range(29):
        clock.advance(60_000)
        store.context(A, "public")
        store.read_page(A, "public")
        store.list_metadata()
    clock.advance(59_999)
    assert store.context(A, "public")  # 29:59.999 after the only turn: alive
    clock.advance(1)
    # Then at 30:00.000 after the turn it is gone: the reads did not extend it
    assert store.context(A, "public") == []
    assert store.read_page(A, "public").turns == []
    assert store.list_metadata().items == []


@pytest.mark.parametrize("how", ["delete", "expire", "inactivity"])
def test_next_turn_after_end_gets_new_never_seen_session(
    store: ConversationStore, clock: ManualClock, how: str
) -> None:
    seen = set()
    for round_no in range(3):
        receipt = store.record(A, "im", AvatarMessage(text=f"round {round_no} secret plan"))
        store.record(A, "im", AgentReply(text=f"noted round {round_no}"))
        assert receipt.new_session and receipt.session_id not in seen
        seen.add(receipt.session_id)
        if how == "delete":
            assert store.delete(A, "im") is True
        elif how == "expire":
            assert store.expire(A, "im") is True
        else:
            clock.advance(CHANNEL_TTL_MS[Channel.IM])
        assert store.context(A, "im") == []
    after = store.record(A, "im", AvatarMessage(text="fresh"))
    assert after.session_id not in seen
    assert [m.content for m in store.context(A, "im")] == ["fresh"]


def test_delete_and_expire_publish_their_reason(store: ConversationStore) -> None:
    store.record(A, "public", AvatarMessage(text="a"))
    store.record(A, "im", AvatarMessage(text="b"))
    assert store.delete(A, "public") is True
    assert store.expire(A, "im") is True
    assert store.delete(A, "public") is False  # nothing left: no second event
    reasons = [(e.reason, e.channel) for e in store.events()]
    assert reasons == [
        (ReasonCode.DELETED_OPERATOR, Channel.PUBLIC),
        (ReasonCode.EXPIRED_OPERATOR, Channel.IM),
    ]


def test_ended_session_leaves_no_key_behind(store: ConversationStore, redis: object) -> None:
    before = all_keys(redis)
    store.record(A, "public", AvatarMessage(text="x"), idempotency_key="1-1")
    store.delete(A, "public")
    leftover = {
        k for k in all_keys(redis) - before if ":s:" in k or k.endswith(("lru:public", "sessions"))
    }
    assert leftover == set()


def test_sweep_frees_idle_sessions_in_batches(store: ConversationStore, clock: ManualClock) -> None:
    # Given 450 public sessions idle past the TTL, and IM sessions that are not
    for n in range(450):
        store.record(avatar(n), "public", AvatarMessage(text="hi"))
        store.record(avatar(n), "im", AvatarMessage(text="hi"))
    clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC])
    fresh = avatar(10_000)
    store.record(fresh, "public", AvatarMessage(text="just arrived"))  # expires a few itself
    # When swept with a limit, exactly that many go
    assert store.sweep(limit=300) == 300
    # Then the rest go on the next sweep, and nothing alive is touched
    assert store.sweep() == 150 - WRITE_SWEEP_BATCH
    assert store.sweep() == 0
    page = store.list_metadata(limit=1000)
    assert {(m.channel, m.avatar_uuid == fresh) for m in page.items} == {
        (Channel.IM, False),
        (Channel.PUBLIC, True),
    }
    assert len(page.items) == 451
    expired = [e for e in store.events(count=1000) if e.reason is ReasonCode.EXPIRED_INACTIVITY]
    assert len(expired) == 450


def test_sweep_expires_at_exact_boundary(store: ConversationStore, clock: ManualClock) -> None:
    store.record(A, "public", AvatarMessage(text="x"))
    clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC] - 1)
    assert store.sweep() == 0
    clock.advance(1)
    assert store.sweep() == 1


class TestClockDomain:
    """A store written under one boot is rebased from wall time under another (DESIGN 4)."""

    def test_reboot_counts_wall_time_elapsed(
        self, store: ConversationStore, clock: ManualClock
    ) -> None:
        store.record(A, "public", AvatarMessage(text="before reboot"))
        clock.advance(10 * 60_000)
        # Host reboots: monotonic restarts near 0, wall clock moved on 15 more minutes
        clock.reboot("boot-2", monotonic_ms=5_000)
        clock.set_wall(clock.wall_ms() + 15 * 60_000)
        # 25 minutes of wall time have passed since the turn: alive until 30
        assert store.context(A, "public")
        clock.advance(5 * 60_000 - 1)
        assert store.context(A, "public")
        clock.advance(1)
        assert store.context(A, "public") == []

    def test_wall_clock_backwards_counts_as_no_time(
        self, store: ConversationStore, clock: ManualClock
    ) -> None:
        store.record(A, "public", AvatarMessage(text="x"))
        clock.reboot("boot-2", monotonic_ms=0)
        clock.set_wall(clock.wall_ms() - 3_600_000)
        receipt = store.record(A, "public", AvatarMessage(text="y"))
        assert not receipt.new_session
        clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC] - 1)
        assert len(store.context(A, "public")) == 2
        clock.advance(1)
        assert store.context(A, "public") == []

    def test_reboot_beyond_ttl_expires(self, store: ConversationStore, clock: ManualClock) -> None:
        first = store.record(A, "public", AvatarMessage(text="x"))
        clock.reboot("boot-2", monotonic_ms=0)
        clock.set_wall(clock.wall_ms() + CHANNEL_TTL_MS[Channel.PUBLIC])
        receipt = store.record(A, "public", AvatarMessage(text="y"))
        assert receipt.new_session and receipt.session_id != first.session_id
