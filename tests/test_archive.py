"""The transcript archive (opt-in): folded records kept for operators, bounded, never in context."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem import TurnView
from tests.helpers import avatar
from tests.helpers import recompute

pytestmark = pytest.mark.both_doors  # every store test, through both doors

A = avatar(1)


def archived(**limits: int) -> ConversationConfig:
    return ConversationConfig(archive_enabled=True, limits=Limits(**limits))


def _walk(store: ConversationStore, direction: str, limit: int) -> list[TurnView]:
    turns: list[TurnView] = []
    anchor = None
    while True:
        page = store.read_page(A, "im", anchor=anchor, direction=direction, limit=limit)
        assert len(page.turns) <= max(1, min(limit, 200))
        turns = turns + page.turns if direction == "forward" else page.turns + turns
        if not page.has_more:
            return turns
        anchor = page.next_anchor


def test_paging_spans_archive_segments_and_live_records(
    make_store: Callable[..., ConversationStore], redis: Any
) -> None:
    store = make_store(
        archived(max_turns_per_session=40, max_archive_segments=1000, max_archive_bytes=64 << 20)
    )
    seqs = [store.record(A, "im", AvatarMessage(text=f"m{i}")).seq for i in range(1100)]
    state = recompute(redis)[("sessions")][f"{A}:im"]
    assert state["archive_count"] > 1000 and state["turns_count"] <= 40  # most are archived
    segments = state["meta_fields"]["segments"].split(",")
    assert len(segments) > 50
    for direction in ("forward", "backward"):
        for limit in (7, 200):
            walked = _walk(store, direction, limit)
            assert [t.seq for t in walked] == seqs
            assert [t.text for t in walked] == [f"m{i}" for i in range(1100)]


@pytest.mark.parametrize(("asked", "got"), [(0, 1), (1, 1), (200, 200), (201, 200)])
def test_limits_are_clamped(
    make_store: Callable[..., ConversationStore], asked: int, got: int
) -> None:
    store = make_store(archived(max_turns_per_session=20, max_archive_segments=1000))
    for i in range(260):
        store.record(A, "im", AvatarMessage(text=f"m{i}"))
    assert len(store.read_page(A, "im", limit=asked).turns) == got
    assert len(store.read_page(A, "im", anchor=0, direction="forward", limit=asked).turns) == got


def test_whole_oldest_segments_go_at_the_bound(
    make_store: Callable[..., ConversationStore], redis: Any
) -> None:
    store = make_store(archived(max_turns_per_session=8, max_archive_segments=3))
    for i in range(100):
        store.record(A, "im", AvatarMessage(text=f"m{i}"))
    state = recompute(redis)["sessions"][f"{A}:im"]
    segments = [
        tuple(int(x) for x in item.split("-"))
        for item in state["meta_fields"]["segments"].split(",")
    ]
    assert len(segments) == 3
    kept = [t.seq for t in _walk(store, "forward", 200)]
    archived_seqs = kept[: state["archive_count"]]
    # exactly the records of the three newest segments, contiguous up to the live ones
    assert archived_seqs == list(range(segments[0][0], segments[-1][1] + 1))
    assert archived_seqs[-1] + 1 == kept[state["archive_count"]]
    assert (
        sum(size for _, _, size in segments)
        == state["archive_bytes"]
        == int(state["meta_fields"]["abytes"])
    )
    dropped = [
        e.detail["archived_segments_dropped"]
        for e in store.events(count=1000)
        if e.reason is ReasonCode.COMPACTED
    ]
    assert sum(dropped) > 0


def test_archive_byte_bound(make_store: Callable[..., ConversationStore], redis: Any) -> None:
    store = make_store(archived(max_turns_per_session=8, max_archive_bytes=1500))
    for i in range(100):
        store.record(A, "im", AvatarMessage(text=f"m{i} " + "x" * 40))
        state = recompute(redis)["sessions"][f"{A}:im"]
        assert state["archive_bytes"] <= 1500
        assert recompute(redis)["stats_bytes"] == state["bytes"] + state["archive_bytes"]


def test_context_never_reads_the_archive(
    make_store: Callable[..., ConversationStore], redis: Any
) -> None:
    store = make_store(archived(max_turns_per_session=8))
    for i in range(30):
        store.record(A, "im", AvatarMessage(text=f"m{i}"))
    sid = store.list_metadata().items[0].session_id
    # a record placed in the archive alone: the operator's reader shows it, the model never sees it
    redis.zadd(f"gm:{{0}}:s:{A}:im:archive", {f'1|1|{sid}|["r","ONLY-IN-ARCHIVE"]': 1})
    assert "ONLY-IN-ARCHIVE" in [t.text for t in _walk(store, "forward", 200)]
    assert all("ONLY-IN-ARCHIVE" not in m.content for m in store.context(A, "im"))


def test_archive_goes_with_its_session(
    make_store: Callable[..., ConversationStore], redis: Any, clock: ManualClock
) -> None:
    store = make_store(archived(max_turns_per_session=8, max_active_sessions=2))
    for who in range(4):
        for i in range(20):
            store.record(avatar(who), "im", AgentReply(text=f"{who}/{i}"))
        clock.advance(10)
    store.delete(avatar(3), "im")  # operator deletion; 0 and 1 were evicted
    state = recompute(redis)
    assert set(state["sessions"]) == {f"{avatar(2)}:im"} and state["orphans"] == []
    assert state["stats_bytes"] == sum(
        s["bytes"] + s["archive_bytes"] for s in state["sessions"].values()
    )
    assert not [k for k in redis.keys("*archive*") if avatar(2).encode() not in k]


def test_archive_is_in_snapshots(redis: Any, clock: ManualClock, tmp_path: Any) -> None:
    store = ConversationStore(
        redis,
        archived(max_turns_per_session=8, max_archive_segments=4),
        clock=clock,
        snapshot_dir=tmp_path / "s",
    )
    for i in range(60):
        store.record(A, "im", AvatarMessage(text=f"m{i}"))
    before = _walk(store, "forward", 200)
    assert len(before) > 8
    store.flush()
    redis.flushall()
    report = store.restore()
    assert report.error is None and report.sessions_restored == 1
    assert _walk(store, "forward", 200) == before
    state = recompute(redis)
    assert state["stats_bytes"] == sum(
        s["bytes"] + s["archive_bytes"] for s in state["sessions"].values()
    )
