"""Record and context throughput, one node against a 3-primary Valkey Cluster.

    python bench/cluster.py [--processes 4] [--sessions 2500] [--ops 20000] [--quick]

Starts one private Valkey on a loopback TCP port and a 3-primary / 3-replica
Valkey Cluster (EmbeddedCluster), both with 16 shards. Against each, `--processes`
client processes (each builds its own client after it starts) first record
`--ops` avatar messages each, round-robin over its own `--sessions` sessions, then
read `--ops` contexts of those sessions. Rows: ops/s of all processes together
(from the first start to the last finish), and the ratio cluster / single node.
Then the record phase on the cluster with `durability = "replica"` (each state
change waits for one replica: WAIT 1) as a ratio to `none`: four half-length runs,
replica, none, none, replica, on new sessions.

Per primary: its share of the FCALLs (INFO commandstats, cmdstat_fcall calls
before/after) and of all command calls, its sessions and used_memory after the
run, and memory per session (growth of used_memory_dataset / sessions). Last, the
single node's own time per record and per context (commandstats usec). On a 2-core machine six nodes and the clients
share two cores, so the cluster cannot show its speed-up here: the shares show
that the load spreads. The machine is shared and noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem.embedded import EmbeddedCluster
from gridmem.embedded import EmbeddedValkey
from gridmem.store import connect
from gridmem.store import connect_cluster
from worker.progress import step

SHARDS = 16
TEXT = "hi! is the sandbox open today? I want to build a boat near the welcome area, ok?"
PHASES = ("record", "context")
# room for every session of every run: nothing is evicted (the default is 10,000 sessions,
# split over the shards)
LIMITS = Limits(max_active_sessions=500_000, max_aggregate_bytes=4 * 1024**3)
TICK = 100  # a process adds to the shared progress counter every TICK calls


@dataclass
class Job:
    url: str
    cluster: bool
    durability: str
    index: int  # the process's number: its avatars are its own
    offset: int  # so that each run writes sessions of its own
    sessions: int
    ops: int
    phases: tuple[str, ...]


def avatars(job: Job) -> list[str]:
    first = job.offset + job.index * job.sessions
    return [str(uuid.UUID(int=first + n + 1)) for n in range(job.sessions)]


def run_client(job: Job, barrier: Barrier, done: Synchronized[int], results: Any) -> None:
    """One client process: its own client and store, a barrier before each phase,
    and (phase, start, end) on `results` (time.monotonic is one clock for all
    processes on Linux)."""
    client: Any = connect_cluster(job.url) if job.cluster else connect(job.url)
    store = ConversationStore(
        client,
        ConversationConfig(shards=SHARDS, limits=LIMITS),
        durability="replica" if job.durability == "replica" else "none",
    )
    people = avatars(job)
    calls: dict[str, Callable[[int], object]] = {
        "record": lambda i: store.record(people[i % job.sessions], "im", AvatarMessage(text=TEXT)),
        "context": lambda i: store.context(people[i % job.sessions], "im"),
    }
    try:
        store.context(people[0], "im")  # connections and the slot map, before the clock
        for phase in job.phases:
            barrier.wait(timeout=120)
            start = time.monotonic()
            for i in range(job.ops):
                calls[phase](i)
                if i % TICK == TICK - 1:
                    with done.get_lock():
                        done.value += TICK
            results.put((phase, start, time.monotonic()))
    finally:
        store.close()


def drive(jobs: list[Job], label: str) -> dict[str, float]:
    """Run the jobs' processes; ops/s per phase, all processes together."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(jobs))
    done: Synchronized[int] = ctx.Value("q", 0)
    results = ctx.Queue()
    processes = [ctx.Process(target=run_client, args=(j, barrier, done, results)) for j in jobs]
    for p in processes:
        p.start()
    spans: dict[str, list[tuple[float, float]]] = {phase: [] for phase in jobs[0].phases}
    expected = len(jobs) * len(jobs[0].phases)
    got = 0
    with step(sys.stderr, label, sum(j.ops for j in jobs) * len(jobs[0].phases)) as bar:
        while got < expected:
            try:
                phase, start, end = results.get(timeout=0.25)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in processes):
                    raise RuntimeError(f"{label}: a client process failed") from None
            else:
                spans[phase].append((start, end))
                got += 1
            bar(done.value)
    for p in processes:
        p.join(60)
    total = {phase: sum(j.ops for j in jobs) for phase in spans}
    return {
        phase: total[phase] / (max(e for _, e in s) - min(b for b, _ in s))
        for phase, s in spans.items()
    }


def node_state(client: redis.Redis) -> dict[str, int]:
    """A node's FCALL and command calls, memory and stored sessions."""
    stats = client.info("commandstats")
    memory = client.info("memory")
    sessions = sum(
        int(client.zcard(key)) for key in client.scan_iter(match="*:sessions", count=1000)
    )
    return {
        "fcall": int(stats.get("cmdstat_fcall", {}).get("calls", 0)),
        "calls": sum(int(v["calls"]) for v in stats.values()),
        "fcall_usec": int(stats.get("cmdstat_fcall", {}).get("usec", 0)),
        # EXEC left out: its time may include the commands it ran, counted on their own
        "usec": sum(int(v["usec"]) for k, v in stats.items() if k != "cmdstat_exec"),
        "memory": int(memory["used_memory"]),
        # the data alone: not the replication backlog, the functions or client buffers
        "dataset": int(memory["used_memory_dataset"]),
        "sessions": sessions,
    }


@dataclass
class Primary:
    name: str
    before: dict[str, int]
    after: dict[str, int] = field(default_factory=dict)

    def grew(self, what: str) -> int:
        return self.after[what] - self.before[what]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def jobs(url: str, cluster: bool, args: argparse.Namespace, **kw: Any) -> list[Job]:
    base = {"durability": "none", "offset": 0, "phases": PHASES, **kw}
    return [
        Job(url, cluster, index=n, sessions=args.sessions, ops=args.ops, **base)
        for n in range(args.processes)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--sessions", type=int, default=2500, help="sessions per process")
    parser.add_argument("--ops", type=int, default=20_000, help="calls per process per phase")
    parser.add_argument("--quick", action="store_true", help="250 sessions, 2,000 ops")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.ops = 250, 2000
    base = Path(tempfile.mkdtemp(prefix="gm-bench-cl-", dir="/tmp"))
    try:
        with EmbeddedValkey(base / "single", port=free_port()) as single:
            url = f"redis://127.0.0.1:{single.port}"
            probe = single.client(decode_responses=True)
            one = Primary("single node", node_state(probe))
            solo = drive(jobs(url, False, args), "single node")
            one.after = node_state(probe)
            probe.close()
        with EmbeddedCluster(base / "cluster") as cluster:
            ports = sorted(cluster.primaries())
            probes = {p: cluster.node_client(p, decode_responses=True) for p in ports}
            primaries = [Primary(f"127.0.0.1:{p}", node_state(probes[p])) for p in ports]
            spread = drive(jobs(cluster.url, True, args), "cluster")
            for primary, port in zip(primaries, ports, strict=True):
                primary.after = node_state(probes[port])
            # durability: record only, new sessions, alternating replica / none twice
            offset = args.processes * args.sessions
            rates: dict[str, list[float]] = {"none": [], "replica": []}
            for r, mode in enumerate(("replica", "none", "none", "replica")):
                run = jobs(
                    cluster.url,
                    True,
                    args,
                    durability=mode,
                    offset=offset * (r + 1),
                    phases=("record",),
                )
                for job in run:  # four half runs: as long as two of the phases above
                    job.ops //= 2
                rates[mode].append(drive(run, f"cluster, durability {mode}")["record"])
            for p in probes.values():
                p.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(args, solo=solo, spread=spread, one=one, primaries=primaries, rates=rates)


def report(
    args: argparse.Namespace,
    *,
    solo: dict[str, float],
    spread: dict[str, float],
    one: Primary,
    primaries: list[Primary],
    rates: dict[str, list[float]],
) -> None:
    turns = args.ops // args.sessions
    print(
        f"\n{args.processes} client processes x {args.ops:,} calls per phase, "
        f"{args.sessions:,} sessions each ({turns} turns each when read), {SHARDS} shards, "
        "TCP loopback\n"
    )
    header = f"{'operation':<10} {'single node ops/s':>18} {'cluster 3x2 ops/s':>18} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for phase in PHASES:
        print(
            f"{phase:<10} {solo[phase]:>18,.0f} {spread[phase]:>18,.0f} "
            f"{spread[phase] / solo[phase]:>6.2f}"
        )
    cores = mp.cpu_count()
    print(
        f"\n(cluster / single: {cores} cores run the clients and all six nodes; "
        "this machine cannot show the cluster's speed-up, only that the load spreads)\n"
    )
    fcalls = sum(p.grew("fcall") for p in primaries)
    calls = sum(p.grew("calls") for p in primaries)
    header = (
        f"{'primary':<18} {'FCALLs':>8} {'share':>6} {'all calls':>10} {'share':>6} "
        f"{'sessions':>9} {'used_memory MiB':>16} {'bytes/session':>14}"
    )
    print("per primary, after the run (bytes/session: growth of used_memory_dataset)\n")
    print(header)
    print("-" * len(header))
    for p in [*primaries, one]:
        sessions = p.grew("sessions")
        print(
            f"{p.name:<18} {p.grew('fcall'):>8,} "
            f"{(p.grew('fcall') / fcalls if p is not one else 1):>6.0%} "
            f"{p.grew('calls'):>10,} {(p.grew('calls') / calls if p is not one else 1):>6.0%} "
            f"{sessions:>9,} {p.after['memory'] / 2**20:>16.1f} "
            f"{p.grew('dataset') / max(sessions, 1):>14,.0f}"
        )
    # one node's own time per call (INFO commandstats usec): what a primary's core can
    # serve, whatever the clients cost (contexts are MULTI/EXEC reads, not FCALLs)
    contexts = args.processes * args.ops
    record_us = one.grew("fcall_usec") / max(one.grew("fcall"), 1)
    context_us = (one.grew("usec") - one.grew("fcall_usec")) / contexts
    print(
        f"\nserver time per call (single node, INFO commandstats): record {record_us:.0f} us, "
        f"context {context_us:.0f} us; one core: about {1e6 / record_us:,.0f} records/s "
        f"or {1e6 / context_us:,.0f} contexts/s, {1e6 / (2 * record_us + context_us):,.0f} "
        "messages/s at 2 records + 1 context a message"
    )
    none, replica = statistics.median(rates["none"]), statistics.median(rates["replica"])
    print(
        f"\nrecord on the cluster, durability none: {none:,.0f} ops/s, replica: "
        f"{replica:,.0f} ops/s (median of 2 alternating half runs each); "
        f"replica / none: {replica / none:.2f}"
    )


if __name__ == "__main__":
    main()
