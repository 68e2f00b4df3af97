"""Exact accounting under a random workload: a hypothesis state machine.

Records, clock moves, operator expiry and deletion, sweeps; with limits small
enough that compaction, summary trimming and eviction happen all the time.
After every step the shard's byte total equals the bytes recomputed from the
session keys, every bound holds, and no key is left without its session.
Runs with the archive on really enable it (issue 12 item 9: they used to build
the store without `archive_enabled`, so no archive check could fail), and prove
the archive filled and dropped segments.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import fakeredis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.conftest import REAL_ENGINES
from tests.helpers import avatar, recompute
from worker import (
    ActionResult,
    AgentReply,
    AvatarMessage,
    ConversationConfig,
    ConversationStore,
    Limits,
    ManualClock,
    ToolSummary,
)
from worker.embedded import EmbeddedValkey

LIMITS = Limits(
    max_active_sessions=5,
    max_turns_per_session=4,
    max_tool_results_per_session=2,
    max_text_bytes=200,
    max_tool_result_bytes=200,
    max_summary_bytes=300,
    max_session_bytes=2000,
    max_aggregate_bytes=2500,
    max_events=25,
    max_archive_segments=2,  # small: archive runs drop whole segments too
    max_archive_bytes=700,
)
AVATARS = [avatar(n) for n in range(3)]
TEXT = st.text(alphabet='abcdé🙂 \n"\\xyz', min_size=1, max_size=260) | st.integers(80, 260).map(
    lambda n: "w" * n
)


class StoreMachine(RuleBasedStateMachine):
    client: Any = None  # set by the test: the backend under test
    archive = False  # set by the test: run with the archive on
    seen: ClassVar[Counter[str]] = Counter()  # reasons over the whole run: proof the paths ran

    @initialize()
    def start(self) -> None:
        self.client.flushall()
        self.clock = ManualClock()
        config = ConversationConfig(limits=LIMITS, archive_enabled=self.archive)
        self.store = ConversationStore(self.client, config, clock=self.clock)

    @rule(
        who=st.sampled_from(AVATARS),
        channel=st.sampled_from(["public", "im"]),
        kind=st.integers(0, 3),
        text=TEXT,
    )
    def record(self, who: str, channel: str, kind: int, text: str) -> None:
        record: Any = [
            AvatarMessage(text=text),
            AgentReply(text=text),
            ToolSummary(tool="probe", summary=text),
            ActionResult(action="wave", status="ok", detail=text),
        ][kind]
        self.store.record(who, channel, record)

    @rule(
        who=st.sampled_from(AVATARS),
        channel=st.sampled_from(["public", "im"]),
        turns=st.integers(3, 8),
    )
    def keep_talking(self, who: str, channel: str, turns: int) -> None:
        """One resident going on: compaction after compaction in one session (archive drops)."""
        for n in range(turns):
            self.store.record(who, channel, AvatarMessage(text=f"and another thing {n}"))

    @rule(ms=st.sampled_from([1, 1000, 1_799_999, 1_800_000, 86_400_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(who=st.sampled_from(AVATARS), channel=st.sampled_from(["public", "im"]))
    def delete(self, who: str, channel: str) -> None:
        self.store.delete(who, channel)

    @rule(who=st.sampled_from(AVATARS), channel=st.sampled_from(["public", "im"]))
    def expire(self, who: str, channel: str) -> None:
        self.store.expire(who, channel)

    @rule(limit=st.integers(1, 5))
    def sweep(self, limit: int) -> None:
        self.store.sweep(limit=limit)

    @invariant()
    def count_events(self) -> None:
        after = getattr(self, "_after", None)
        for event in self.store.events(after=after, count=1000):
            self.seen[event.reason.value] += 1
            dropped = event.detail.get("archived_segments_dropped", 0)
            self.seen["archive_segments_dropped"] += int(dropped)
            self._after = event.id

    @invariant()
    def accounting_is_exact(self) -> None:
        state = recompute(self.client)
        sessions = state["sessions"]
        assert state["orphans"] == []
        assert set(sessions) == state["indexed"] == state["lru"]
        assert state["stats_bytes"] == sum(
            s["bytes"] + s["archive_bytes"] for s in sessions.values()
        )
        for s in sessions.values():
            meta = s["meta_fields"]
            assert int(meta["bytes"]) == s["bytes"] <= LIMITS.max_session_bytes
            assert int(meta["turns"]) == s["turns_count"] <= LIMITS.max_turns_per_session
            assert int(meta["tools"]) == s["tools_count"] <= LIMITS.max_tool_results_per_session
            assert s["summary_bytes"] <= LIMITS.max_summary_bytes
            assert int(meta.get("abytes", 0)) == s["archive_bytes"] <= LIMITS.max_archive_bytes
            assert (
                len([x for x in meta.get("segments", "").split(",") if x])
                <= LIMITS.max_archive_segments
            )
        assert len(sessions) <= LIMITS.max_active_sessions
        assert state["stats_bytes"] <= LIMITS.max_aggregate_bytes
        if self.archive:  # the archive holds folded records only: never a live one
            for s in sessions.values():
                assert s["archive_count"] == 0 or s["turns_count"] >= 1
                self.seen["archived_records"] += s["archive_count"]
        else:
            assert all(s["archive_count"] == 0 for s in sessions.values())
        assert state["events"] <= LIMITS.max_events


EXERCISED = {
    "compacted", "summary_trimmed", "evicted_session_limit", "evicted_aggregate_bytes",
    "expired_inactivity", "expired_operator", "deleted_operator",
}  # fmt: skip


def _run(client: Any, examples: int, archive: bool = False) -> Counter[str]:
    StoreMachine.client = client
    StoreMachine.archive = archive
    StoreMachine.seen = Counter()
    StoreMachine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=40,
        deadline=None,
        derandomize=True,  # the same workload on every run: CI stays reproducible
        suppress_health_check=[HealthCheck.too_slow],
    )
    StoreMachine.TestCase().runTest()
    return StoreMachine.seen


def _check_exercised(seen: Counter[str], archive: bool) -> None:
    assert set(seen) >= EXERCISED
    if archive:  # the archive checks above ran on archives that held records
        assert seen["archived_records"] > 0
        assert seen["archive_segments_dropped"] > 0


@pytest.mark.fake
@pytest.mark.parametrize("archive", [False, True])
def test_accounting_on_fakeredis(archive: bool) -> None:
    seen = _run(fakeredis.FakeRedis(server=fakeredis.FakeServer()), examples=60, archive=archive)
    _check_exercised(seen, archive)


@pytest.mark.real
@pytest.mark.parametrize("engine", list(REAL_ENGINES))
def test_accounting_on_a_real_server(real_servers: dict[str, EmbeddedValkey], engine: str) -> None:
    seen = _run(real_servers[engine].client(), examples=50, archive=True)
    _check_exercised(seen, archive=True)
