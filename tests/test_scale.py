"""Thousands of senders on a real server: every bound holds at every sampled step."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedValkey

pytestmark = pytest.mark.real

LIMITS = Limits(
    max_active_sessions=2000,
    max_turns_per_session=10,
    max_tool_results_per_session=3,
    max_text_bytes=1000,
    max_tool_result_bytes=1000,
    max_summary_bytes=1500,
    max_session_bytes=6000,
    max_aggregate_bytes=1024 * 1024,
    max_events=2000,
)
SENDERS = 6000
RECORDS = 24_000
SAMPLE_EVERY = 1000
# Server memory growth over an empty server (function library loaded), as a
# multiple of max_aggregate_bytes: README.md and docs/architecture.md document
# 2.6x for these small sessions (~680 bytes each: a session's fixed cost of keys,
# metadata and index entries, about 550 bytes, dominates; the event stream holds
# 2,000 events). Measured 2.60-2.62x; the bound allows the documented figure plus
# a 5% margin for allocator differences, so a change that costs memory fails here.
DOCUMENTED_MULTIPLE = 2.6
MEMORY_MULTIPLE = DOCUMENTED_MULTIPLE * 1.05


def _check_bounds(store: ConversationStore, client: Any) -> dict[str, int]:
    items = []
    cursor = None
    while True:
        page = store.list_metadata(cursor=cursor, limit=1000)
        items += page.items
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(items) <= LIMITS.max_active_sessions
    assert all(m.byte_count <= LIMITS.max_session_bytes for m in items)
    assert all(m.turn_count <= LIMITS.max_turns_per_session for m in items)
    pipe = client.pipeline(transaction=False)
    for m in items:
        pipe.strlen(f"gm:{{0}}:s:{m.avatar_uuid}:{m.channel.value}:summary")
    assert max(pipe.execute(), default=0) <= LIMITS.max_summary_bytes
    total = int(client.hget("gm:{0}:stats", "bytes") or 0)
    assert total <= LIMITS.max_aggregate_bytes
    assert client.xlen("gm:{0}:events") <= LIMITS.max_events
    return {"sessions": len(items), "bytes": total}


def test_six_thousand_senders_stay_within_every_bound(
    real_servers: dict[str, EmbeddedValkey],
) -> None:
    client = real_servers["valkey"].client()
    client.flushall()
    client.function_flush()
    clock = ManualClock()
    store = ConversationStore(client, ConversationConfig(limits=LIMITS), clock=clock)
    store.stats()  # loads the function library: the baseline holds it whatever ran before
    baseline = client.info("memory")["used_memory"]
    rng = random.Random(5)
    senders = [f"{rng.getrandbits(32):08x}-0000-4000-8000-{n:012x}" for n in range(SENDERS)]
    peak_memory = 0
    samples = []
    for step in range(1, RECORDS + 1):
        # a few regulars talk a lot (compaction); the crowd passes by (eviction)
        who = senders[rng.randrange(50)] if rng.random() < 0.3 else senders[rng.randrange(SENDERS)]
        channel = Channel.IM if rng.random() < 0.4 else Channel.PUBLIC
        size = rng.choice([20, 80, 300, 900])
        kind = rng.random()
        if kind < 0.6:
            store.record(who, channel, AvatarMessage(text="a" * size))
        elif kind < 0.85:
            store.record(who, channel, AgentReply(text="r" * size))
        else:
            store.record(who, channel, ToolSummary(tool="look", summary="t" * size))
        clock.advance(rng.randint(1, 200))
        if step % SAMPLE_EVERY == 0:
            samples.append(_check_bounds(store, client))
            peak_memory = max(peak_memory, client.info("memory")["used_memory"])
    multiple = (peak_memory - baseline) / LIMITS.max_aggregate_bytes
    print(
        f"\nscale: {len(samples)} samples, last {samples[-1]}, "
        f"memory growth {multiple:.2f}x max_aggregate_bytes"
    )
    assert (
        samples[-1]["bytes"] > LIMITS.max_aggregate_bytes * 0.5
    )  # the bound was actually under pressure
    assert multiple <= MEMORY_MULTIPLE
    reasons = {e.reason.value for e in store.events(count=2000)}
    assert {"compacted", "evicted_aggregate_bytes"} <= reasons or {
        "compacted",
        "evicted_session_limit",
    } <= reasons
