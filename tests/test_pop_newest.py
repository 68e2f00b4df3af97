"""pop_newest: the newest live record of a session removed atomically (issue 17: the
OpenAI Agents SDK's Session.pop_item), on both doors and every backend, the cluster too.
Expected values come from what the test recorded, and the bytes from the keys
themselves (tests/helpers.py recompute), never from the code under test."""

from __future__ import annotations

from typing import Any

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import InvalidInput
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem import ToolSummary
from gridmem.records import CHANNEL_TTL_MS
from tests.helpers import avatar
from tests.helpers import recompute

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]

A = avatar(17)


def _check_accounting(redis: Any) -> dict[str, Any]:
    """meta's counts and the shard's byte total equal what the keys hold."""
    seen = recompute(redis)
    for parts in seen["sessions"].values():
        meta = parts["meta_fields"]
        assert int(meta["turns"]) == parts["turns_count"]
        assert int(meta["tools"]) == parts["tools_count"]
        assert int(meta["bytes"]) == parts["bytes"]
    total = sum(p["bytes"] + p["archive_bytes"] for p in seen["sessions"].values())
    assert seen["stats_bytes"] == total
    assert not seen["orphans"]
    return seen


def test_pops_the_newest_record_and_keeps_accounting_exact(
    store: ConversationStore, redis: Any
) -> None:
    # Given three records, the newest a tool summary
    store.record(A, "public", AvatarMessage(text="first words"))
    store.record(A, "public", AgentReply(text="second words"))
    third = store.record(A, "public", ToolSummary(tool="search", summary="third words"))
    before = _check_accounting(redis)
    # When the newest is popped
    popped = store.pop_newest(A, "public")
    # Then it is the one recorded last, the context lost it and only it
    assert popped is not None and popped.seq == third.seq and popped.kind == "tool_summary"
    assert "third words" in popped.text
    contents = [m.content for m in store.context(A, "public")]
    assert contents == ["first words", "second words"]
    after = _check_accounting(redis)
    (parts,) = after["sessions"].values()
    assert parts["turns_count"] == 2 and parts["tools_count"] == 0
    assert after["stats_bytes"] < before["stats_bytes"]
    # And one event says what went, in counts
    (event,) = store.events()
    assert event.reason is ReasonCode.POPPED_NEWEST
    assert event.session_id == third.session_id and event.channel is Channel.PUBLIC
    freed = before["stats_bytes"] - after["stats_bytes"]
    assert event.detail == {"seq": third.seq, "bytes": freed, "turns": 2}
    assert "third" not in event.model_dump_json()


def test_popping_the_last_record_ends_the_session_whole(
    store: ConversationStore, redis: Any
) -> None:
    first = store.record(A, "im", AvatarMessage(text="only words"))
    store.record(avatar(18), "im", AvatarMessage(text="a neighbour"))
    popped = store.pop_newest(A, "im")
    assert popped is not None and popped.seq == first.seq
    seen = _check_accounting(redis)
    assert list(seen["sessions"]) == [f"{avatar(18)}:im"]  # no key of A's left
    assert seen["indexed"] == seen["lru"] == {f"{avatar(18)}:im"}
    assert [e.reason for e in store.events()] == [ReasonCode.POPPED_NEWEST]
    assert store.pop_newest(A, "im") is None  # nothing left: no record, no event
    assert len(store.events()) == 1
    again = store.record(A, "im", AvatarMessage(text="back"))
    assert again.new_session and again.session_id != first.session_id


def test_pop_until_empty_with_a_summary_ends_the_session_whole(make_store: Any, redis: Any) -> None:
    """With compaction, the summary and archive go with the last live record."""
    store: ConversationStore = make_store(
        ConversationConfig(limits=Limits(max_turns_per_session=4), archive_enabled=True)
    )
    for i in range(6):
        store.record(A, "public", AvatarMessage(text=f"words {i}"))
    live = [m for m in store.context(A, "public") if m.content.startswith("words")]
    popped = [store.pop_newest(A, "public") for _ in live]
    assert [p.text for p in popped if p] == [m.content for m in reversed(live)]
    _check_accounting(redis)
    assert recompute(redis)["sessions"] == {} and recompute(redis)["stats_bytes"] == 0
    assert store.pop_newest(A, "public") is None


def test_a_popped_records_receipt_goes_with_it(store: ConversationStore) -> None:
    store.record(A, "public", AvatarMessage(text="kept"))
    first = store.record(A, "public", AvatarMessage(text="undone"), idempotency_key="m-2")
    store.pop_newest(A, "public")
    assert store.receipt(A, "public", "m-2") is None
    redo = store.record(A, "public", AvatarMessage(text="undone"), idempotency_key="m-2")
    assert redo.seq > first.seq  # stored again, not answered with the popped receipt


def test_an_expired_session_has_nothing_to_pop(
    store: ConversationStore, clock: ManualClock, redis: Any
) -> None:
    store.record(A, "public", AvatarMessage(text="old words"))
    clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC])
    assert store.pop_newest(A, "public") is None
    assert [e.reason for e in store.events()] == [ReasonCode.EXPIRED_INACTIVITY]
    assert recompute(redis)["sessions"] == {}


def test_popping_is_not_activity(store: ConversationStore, clock: ManualClock) -> None:
    store.record(A, "public", AvatarMessage(text="one"))
    store.record(A, "public", AvatarMessage(text="two"))
    clock.advance(CHANNEL_TTL_MS[Channel.PUBLIC] - 1)
    assert store.pop_newest(A, "public") is not None
    clock.advance(1)  # the TTL counts from the last recorded turn, not from the pop
    assert store.pop_newest(A, "public") is None
    assert store.events()[-1].reason is ReasonCode.EXPIRED_INACTIVITY


@pytest.mark.single_node  # the command counter watches one server's client
def test_bad_input_is_refused_before_redis(store: ConversationStore, command_counter: Any) -> None:
    for uuid, channel in ((A.upper() + "x", "public"), (A, "group")):
        with pytest.raises(InvalidInput):
            store.pop_newest(uuid, channel)
    assert command_counter.commands == []
