"""Exact accounting under a random workload: a hypothesis state machine.

Records, clock moves, operator expiry and deletion, sweeps; with limits small
enough that compaction, summary trimming and eviction happen all the time.
After every step the shard's byte total equals the bytes recomputed from the
session keys, every bound holds, and no key is left without its session.
Runs with the archive on really enable it (issue 12 item 9: they used to build
the store without `archive_enabled`, so no archive check could fail), and prove
the archive filled and dropped segments. Runs over 3 and 4 shards check every
shard against its share and the sum over the shards, archives included, against
the global bounds (issue 12 item 5).
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from typing import ClassVar

import fakeredis
import pytest
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import rule

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.config import ShardLimits
from gridmem.config import shard_limits
from gridmem.embedded import EmbeddedValkey
from gridmem.keys import KeySpace
from tests.conftest import REAL_ENGINES
from tests.helpers import avatar
from tests.helpers import recompute

# One shard's bounds: small enough that compaction, trimming and eviction happen all
# the time; the byte share holds one session and its archive (config.shard_limits).
PER_SHARD = {"sessions": 5, "bytes": 2_800}
WHO = st.integers(0, 23)  # an index into the run's avatars (4, 6 or 8 of them)
SESSION = dict(
    max_turns_per_session=4,
    max_tool_results_per_session=2,
    max_text_bytes=200,
    max_tool_result_bytes=200,
    max_summary_bytes=300,
    max_session_bytes=2000,
    max_events=25,
    max_archive_segments=2,  # small: archive runs drop whole segments too
    max_archive_bytes=700,
)
LIMITS = Limits(
    max_active_sessions=PER_SHARD["sessions"], max_aggregate_bytes=PER_SHARD["bytes"], **SESSION
)


TEXT = st.text(alphabet='abcdé🙂 \n"\\xyz', min_size=1, max_size=260) | st.integers(80, 260).map(
    lambda n: "w" * n
)


def sharded(shards: int) -> tuple[Limits, list[str]]:
    """Global limits over `shards` that split into 3 sessions and 2,700 bytes a shard
    (one session and its archive; plus a remainder the split must drop), and 2
    avatars per shard (4 sessions): each shard goes over both its bounds."""
    limits = Limits(
        max_active_sessions=3 * shards + shards - 1,
        max_aggregate_bytes=2_700 * shards + shards - 1,
        **SESSION,
    )
    space, found = KeySpace("gm", shards), Counter[int]()
    avatars = []
    for n in range(10_000):
        shard = space.shard_of(avatar(n))
        if found[shard] < 2:
            found[shard] += 1
            avatars.append(avatar(n))
    assert sorted(found.values()) == [2] * shards
    return limits, avatars


class StoreMachine(RuleBasedStateMachine):
    client: Any = None  # set by the test: the backend under test
    archive = False  # set by the test: run with the archive on
    shards = 1  # set by the test, with the limits and avatars that go with it
    limits = LIMITS
    avatars: ClassVar[list[str]] = [avatar(n) for n in range(4)]
    seen: ClassVar[Counter[str]] = Counter()  # reasons over the whole run: proof the paths ran

    @initialize()
    def start(self) -> None:
        self.client.flushall()
        self.clock = ManualClock()
        config = ConversationConfig(
            limits=self.limits, archive_enabled=self.archive, shards=self.shards
        )
        self.store = ConversationStore(self.client, config, clock=self.clock)

    @rule(
        who=WHO,
        channel=st.sampled_from(["public", "im"]),
        kind=st.integers(0, 3),
        text=TEXT,
    )
    def record(self, who: int, channel: str, kind: int, text: str) -> None:
        record: Any = [
            AvatarMessage(text=text),
            AgentReply(text=text),
            ToolSummary(tool="probe", summary=text),
            ActionResult(action="wave", status="ok", detail=text),
        ][kind]
        self.store.record(self.resident(who), channel, record)

    @rule(
        who=WHO,
        channel=st.sampled_from(["public", "im"]),
        turns=st.integers(3, 8),
    )
    def keep_talking(self, who: int, channel: str, turns: int) -> None:
        """One resident going on: compaction after compaction in one session (archive drops)."""
        for n in range(turns):
            self.store.record(
                self.resident(who), channel, AvatarMessage(text=f"and another thing {n}")
            )

    @rule(who=WHO, channel=st.sampled_from(["public", "im"]))
    def fill(self, who: int, channel: str) -> None:
        """One resident pasting long lines: its session near its byte bound, with a
        full archive, so the shard's other sessions go for bytes."""
        for n in range(10):
            self.store.record(self.resident(who), channel, AvatarMessage(text=f"{n} " + "w" * 190))

    def resident(self, who: int) -> str:
        return self.avatars[who % len(self.avatars)]

    @rule(ms=st.sampled_from([1, 1000, 1_799_999, 1_800_000, 86_400_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(who=WHO, channel=st.sampled_from(["public", "im"]))
    def delete(self, who: int, channel: str) -> None:
        self.store.delete(self.resident(who), channel)

    @rule(who=WHO, channel=st.sampled_from(["public", "im"]))
    def expire(self, who: int, channel: str) -> None:
        self.store.expire(self.resident(who), channel)

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
        share = shard_limits(self.limits, self.shards, archive=self.archive)
        held = {"sessions": 0, "bytes": 0, "events": 0}
        for shard in range(self.shards):
            state = recompute(self.client, shard=shard, shards=self.shards)
            self.check_shard(state, share)
            held["sessions"] += len(state["sessions"])
            held["bytes"] += state["stats_bytes"]
            held["events"] += state["events"]
        # what every shard holds together, archives included, stays within the
        # global bounds (issue 12 item 5)
        assert held["sessions"] <= self.limits.max_active_sessions
        assert held["bytes"] <= self.limits.max_aggregate_bytes
        assert held["events"] <= self.limits.max_events

    def check_shard(self, state: dict[str, Any], share: ShardLimits) -> None:
        """One shard: its byte total exact, every session and the shard within bounds."""
        limits, sessions = self.limits, state["sessions"]
        assert state["orphans"] == []
        assert set(sessions) == state["indexed"] == state["lru"]
        assert state["stats_bytes"] == sum(
            s["bytes"] + s["archive_bytes"] for s in sessions.values()
        )
        for s in sessions.values():
            meta = s["meta_fields"]
            assert int(meta["bytes"]) == s["bytes"] <= limits.max_session_bytes
            assert int(meta["turns"]) == s["turns_count"] <= limits.max_turns_per_session
            assert int(meta["tools"]) == s["tools_count"] <= limits.max_tool_results_per_session
            assert s["summary_bytes"] <= limits.max_summary_bytes
            assert int(meta.get("abytes", 0)) == s["archive_bytes"] <= limits.max_archive_bytes
            assert (
                len([x for x in meta.get("segments", "").split(",") if x])
                <= limits.max_archive_segments
            )
        assert len(sessions) <= share.max_sessions
        assert state["stats_bytes"] <= share.max_aggregate_bytes
        if self.archive:  # the archive holds folded records only: never a live one
            for s in sessions.values():
                assert s["archive_count"] == 0 or s["turns_count"] >= 1
                self.seen["archived_records"] += s["archive_count"]
        else:
            assert all(s["archive_count"] == 0 for s in sessions.values())
        assert state["events"] <= share.max_events


EXERCISED = {
    "compacted", "summary_trimmed", "evicted_session_limit", "evicted_aggregate_bytes",
    "expired_inactivity", "expired_operator", "deleted_operator",
}  # fmt: skip


def _run(client: Any, examples: int, archive: bool = False, shards: int = 1) -> Counter[str]:
    StoreMachine.client = client
    StoreMachine.archive = archive
    StoreMachine.shards = shards
    if shards == 1:
        StoreMachine.limits, StoreMachine.avatars = LIMITS, [avatar(n) for n in range(4)]
    else:
        StoreMachine.limits, StoreMachine.avatars = sharded(shards)
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


@pytest.mark.fake
@pytest.mark.parametrize("shards", [3, 4])
def test_accounting_across_shards_with_the_archive_on_fakeredis(shards: int) -> None:
    """The aggregate over every shard, archives included, within the global bounds."""
    seen = _run(fakeredis.FakeRedis(server=fakeredis.FakeServer()), 40, archive=True, shards=shards)
    _check_exercised(seen, archive=True)


@pytest.mark.real
@pytest.mark.parametrize("engine", list(REAL_ENGINES))
def test_accounting_on_a_real_server(real_servers: dict[str, EmbeddedValkey], engine: str) -> None:
    seen = _run(real_servers[engine].client(), examples=50, archive=True)
    _check_exercised(seen, archive=True)


@pytest.mark.real
@pytest.mark.parametrize("engine", list(REAL_ENGINES))
def test_accounting_across_shards_on_a_real_server(
    real_servers: dict[str, EmbeddedValkey], engine: str
) -> None:
    seen = _run(real_servers[engine].client(), examples=30, archive=True, shards=3)
    _check_exercised(seen, archive=True)
