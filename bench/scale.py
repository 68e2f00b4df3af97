"""Thousands of senders under hard bounds: memory per session and the cost of the bounds.

    python bench/scale.py [--senders 20000] [--records 60000] [--quick]

Two private Valkey servers get the same workload, interleaved in chunks so the
machine's noise hits both alike: one with small limits (compaction, summary
trimming and eviction all the time), one with limits so roomy that nothing is
ever folded or evicted. Prints record throughput of each and their ratio, Redis
memory per active session and per logical byte under pressure, and events by
reason code.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedValkey
from worker.progress import step

PRESSURE = Limits(
    max_active_sessions=5000,
    max_turns_per_session=20,
    max_tool_results_per_session=5,
    max_text_bytes=1000,
    max_tool_result_bytes=1000,
    max_summary_bytes=2000,
    max_session_bytes=8000,
    max_aggregate_bytes=4 * 1024 * 1024,
    max_events=10_000,
)
# PRESSURE's record sizes, with every count and byte bound far out of reach
ROOMY = Limits.model_validate(
    PRESSURE.model_dump()
    | {
        "max_active_sessions": 1_000_000,
        "max_turns_per_session": 5000,
        "max_tool_results_per_session": 500,
        "max_summary_bytes": Limits().max_summary_bytes,
        "max_session_bytes": 8 * 1024 * 1024,
        "max_aggregate_bytes": 16 * 1024**3,
    }
)
CHUNK = 1000


Work = list[tuple[str, Channel, object]]


def workload(senders: int, records: int, seed: int = 11) -> Work:
    rng = random.Random(seed)
    people = [f"{rng.getrandbits(32):08x}-0000-4000-8000-{n:012x}" for n in range(senders)]
    out: list[tuple[str, Channel, object]] = []
    for _ in range(records):
        who = people[rng.randrange(200)] if rng.random() < 0.3 else people[rng.randrange(senders)]
        channel = Channel.IM if rng.random() < 0.4 else Channel.PUBLIC
        size = rng.choice([20, 60, 120, 300, 900])
        kind = rng.random()
        if kind < 0.6:
            record: object = AvatarMessage(text="a" * size)
        elif kind < 0.9:
            record = AgentReply(text="r" * size)
        else:
            record = ToolSummary(tool="look", summary="t" * size)
        out.append((who, channel, record))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=20_000)
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--quick", action="store_true", help="5,000 senders, 15,000 records")
    args = parser.parse_args()
    if args.quick:
        args.senders, args.records = 5000, 15_000
    work = workload(args.senders, args.records)
    dirs = [Path(tempfile.mkdtemp(prefix=f"gm-scale-{n}-", dir="/tmp")) for n in (0, 1)]
    try:
        with EmbeddedValkey(dirs[0]) as tight, EmbeddedValkey(dirs[1]) as roomy:
            run(work, {"bounds under pressure": (tight, PRESSURE), "no pressure": (roomy, ROOMY)})
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def run(
    work: list[tuple[str, Channel, object]], sides: dict[str, tuple[EmbeddedValkey, Limits]]
) -> None:
    stores, seconds, baselines = {}, {}, {}
    for name, (server, limits) in sides.items():
        client = server.client()
        client.flushall()
        baselines[name] = client.info("memory")["used_memory"]
        stores[name] = ConversationStore(
            client, ConversationConfig(limits=limits), clock=ManualClock()
        )
        seconds[name] = 0.0
    with step(sys.stderr, "records", len(work)) as bar:
        for start in range(0, len(work), CHUNK):
            chunk = work[start : start + CHUNK]
            for name, store in stores.items():
                clock = store.clock
                t = time.perf_counter()
                for who, channel, record in chunk:
                    store.record(who, channel, record)  # type: ignore[arg-type]
                    clock.advance(50)  # type: ignore[attr-defined]
                seconds[name] += time.perf_counter() - t
            bar(min(start + CHUNK, len(work)))
    report(work, stores, seconds, baselines)


def report(
    work: Work,
    stores: dict[str, ConversationStore],
    seconds: dict[str, float],
    baselines: dict[str, int],
) -> None:
    senders = len({w[0] for w in work})
    print(f"\n{len(work):,} records from {senders:,} senders, chunks of {CHUNK} alternating\n")
    print(
        f"{'run':<24} {'records/s':>10} {'sessions':>9} {'logical MiB':>12} "
        f"{'used_memory MiB':>16} {'B/session':>10} {'mem/logical':>12}"
    )
    rates = {}
    for name, store in stores.items():
        client = store.redis
        sessions = client.zcard("gm:{0}:lru:public") + client.zcard("gm:{0}:lru:im")
        logical = int(client.hget("gm:{0}:stats", "bytes") or 0)
        growth = client.info("memory")["used_memory"] - baselines[name]
        rates[name] = len(work) / seconds[name]
        print(
            f"{name:<24} {rates[name]:>10,.0f} {sessions:>9,} {logical / 2**20:>12.2f} "
            f"{growth / 2**20:>16.2f} {growth / max(sessions, 1):>10,.0f} "
            f"{growth / max(logical, 1):>12.2f}"
        )
    names = list(stores)
    ratio = rates[names[0]] / rates[names[1]]
    print(f"\nthroughput with bounds active / without pressure: {ratio:.2f}")
    reasons: Counter[str] = Counter()
    after = None
    tight = stores[names[0]]
    while batch := tight.events(after=after, count=10_000):
        reasons.update(e.reason.value for e in batch)
        after = batch[-1].id
    counts = ", ".join(f"{k}={v:,}" for k, v in sorted(reasons.items()))
    print(f"events kept (max_events = 10,000) by reason: {counts}")


if __name__ == "__main__":
    main()
