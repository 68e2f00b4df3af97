"""Snapshot flush and restore at scale, and how long any one server call blocks.

    python bench/snapshots.py [--sessions 10000] [--records 6]

Fills a private Valkey with N sessions (both channels, mixed record sizes),
then measures flush() (MB/s of the generation written) and restore() into a
new, empty Valkey, as at a start (sessions/s). SLOWLOG records every command's
server time, so the table also shows the longest single server-blocking call of
each phase (and where in the phase it came, and how many took over 5 ms): export
and restore work in bounded batches, so it must stay small. How long the server waited for a CPU
(Linux schedstat) tells a call the scheduler stretched from a batch too large.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedValkey
from worker.progress import step


def fill(store: ConversationStore, sessions: int, records: int) -> None:
    rng = random.Random(3)
    with step(sys.stderr, "filling", sessions) as bar:
        for n in range(sessions):
            who = f"{rng.getrandbits(32):08x}-0000-4000-8000-{n:012x}"
            channel = Channel.PUBLIC if n % 2 else Channel.IM
            for r in range(records):
                size = rng.choice([30, 80, 200, 600])
                if r % 3 == 0:
                    store.record(who, channel, AvatarMessage(text="a" * size))
                elif r % 3 == 1:
                    store.record(who, channel, AgentReply(text="r" * size))
                else:
                    store.record(who, channel, ToolSummary(tool="look", summary="t" * size))
            bar(n + 1)


def server_calls_us(client: object) -> dict[str, list[int]]:
    """Server time of each of gridmem's calls since the last SLOWLOG reset, by command,
    in the order the server ran them."""
    calls: dict[str, list[int]] = {}
    entries = client.slowlog_get(1_000_000)  # type: ignore[attr-defined]
    for entry in sorted(entries, key=lambda e: e["id"]):
        command = entry["command"]
        text = command.decode() if isinstance(command, bytes) else str(command)
        name = text.split(" ")[0].upper()
        if name in {"FCALL", "FUNCTION"}:  # gridmem's calls (inner commands are logged too)
            calls.setdefault(name, []).append(int(entry["duration"]))
    return calls


def describe(calls: dict[str, list[int]]) -> str:
    parts = []
    for name, times in sorted(calls.items()):
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        longest = max(range(len(times)), key=times.__getitem__) + 1
        over = sum(t > 5_000 for t in times)
        parts.append(
            f"{name} x{len(ordered)}: max {ordered[-1]:,} (call {longest:,}), p99 {p99:,}, "
            f"median {ordered[len(ordered) // 2]:,}, over 5 ms {over}"
        )
    return "; ".join(parts)


def cpu_wait_ms(pid: int | None) -> float | None:
    """How long the server has waited for a CPU, runnable but not running (Linux
    schedstat, ms): a call the server spent waiting shows in SLOWLOG as a long one."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def waited(before: float | None, after: float | None) -> str:
    return "n/a" if before is None or after is None else f"{after - before:,.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=6, help="records per session")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gm-bench-snap-", dir="/tmp"))
    limits = Limits(max_active_sessions=max(10_000, args.sessions))
    try:
        with EmbeddedValkey(base / "valkey") as server:
            client = server.client()
            client.config_set("slowlog-max-len", 1_000_000)
            store = ConversationStore(
                client, ConversationConfig(limits=limits), snapshot_dir=base / "conversations"
            )
            # The fill is not logged: resetting a log of its 60,000 calls stalls the
            # server, and the flush's first call would seem to take 30-70 ms.
            client.config_set("slowlog-log-slower-than", -1)
            fill(store, args.sessions, args.records)
            client.config_set("slowlog-log-slower-than", 0)
            client.slowlog_reset()
            wait0 = cpu_wait_ms(server.pid)
            start = time.perf_counter()
            info = store.flush()
            flush_s = time.perf_counter() - start
            flush_wait = waited(wait0, cpu_wait_ms(server.pid))
            flush_calls = server_calls_us(client)
            assert info is not None
        # Restore runs where it does in use: a server just started, empty. (Restoring
        # into this one after FLUSHALL, the first call after the flush of the whole
        # keyspace took 5-9 ms in half the runs, and the calls after it 0.3 ms.)
        with EmbeddedValkey(base / "valkey-restarted") as server:
            client = server.client()
            client.config_set("slowlog-max-len", 1_000_000)
            client.config_set("slowlog-log-slower-than", 0)
            store = ConversationStore(
                client, ConversationConfig(limits=limits), snapshot_dir=base / "conversations"
            )
            client.slowlog_reset()
            wait0 = cpu_wait_ms(server.pid)
            start = time.perf_counter()
            report = store.restore()
            restore_s = time.perf_counter() - start
            restore_wait = waited(wait0, cpu_wait_ms(server.pid))
            restore_calls = server_calls_us(client)
            assert report.error is None and report.sessions_restored == info.sessions, report
    finally:
        shutil.rmtree(base, ignore_errors=True)

    mib = info.bytes / 2**20
    print(f"\n{info.sessions:,} sessions, {args.records} records each; generation {mib:.1f} MiB\n")
    print(f"{'phase':<10} {'seconds':>8} {'rate':>22}   server time of each call (us)")
    rows = [
        ("flush", flush_s, f"{mib / flush_s:>17.1f} MB/s", flush_calls),
        ("restore", restore_s, f"{info.sessions / restore_s:>11,.0f} sessions/s", restore_calls),
    ]
    for phase, seconds, rate, calls in rows:
        print(f"{phase:<10} {seconds:>8.2f} {rate:>22}   {describe(calls)}")
    print(
        f"\nThe server waited for a CPU (runnable, not running): flush {flush_wait}, "
        f"restore {restore_wait}."
    )
    print("(FUNCTION: the one-time FUNCTION LOAD of gridmem's library; FCALL: the batches;")
    print(" call n: the longest call's place in the phase, 1 = its first.)")
    print(
        "SLOWLOG times are the server's wall time: on a shared machine a descheduled server"
        "\nshows as a lone long call; p99 next to max tells such a spike from a batch too large."
    )


if __name__ == "__main__":
    main()
