"""End-to-end service throughput and latency: inbound stream -> workers -> outbound stream.

    python bench/service.py [--messages 3000] [--avatars 600] [--quick]

Runs the real service (supervisor, private Valkey, worker processes) in this
process's background and plays a grid bridge: a burst of messages over many
avatars on both channels, then reads every reply from the outbound stream.
Rows: the built-in offline responder with 1 and 2 worker processes (their ratio
is the scaling), and the DESIGN yardstick: 1 process at concurrency 32 against
an endpoint that takes 500 ms per answer (target: at least 50 messages/s).
Latency is from XADD on the inbound stream to the reply's arrival on the
outbound stream, for a burst (so it includes queueing).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from gridmem.config import Settings
from tests.helpers import avatar
from worker.localllm import LocalChatServer
from worker.progress import step
from worker.service import GROUP
from worker.supervisor import Supervisor


def wait_for_workers(client: Any, supervisor: threading.Thread, processes: int) -> None:
    """Until every worker process reads the inbound stream (it then is a consumer
    of the group), at most 60 s, waiting on the supervisor thread between checks."""

    def consumers() -> int:
        try:
            groups = client.xinfo_groups("gm:inbound")
        except redis.ResponseError:
            return 0  # no stream yet: no worker has created the group
        return sum(group["consumers"] for group in groups if group["name"] == GROUP)

    deadline = time.monotonic() + 60
    while consumers() < processes:
        if time.monotonic() > deadline or not supervisor.is_alive():
            raise RuntimeError("the worker processes did not start")
        supervisor.join(timeout=0.05)


def run_case(
    processes: int, messages: int, avatars: int, llm_delay: float | None
) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="gm-bench-svc-", dir="/tmp"))
    llm = LocalChatServer(delay_seconds=llm_delay or 0).start() if llm_delay is not None else None
    settings = Settings(
        storage_path=base,
        llm={"base_url": llm.url if llm else None, "timeout_seconds": 30},
        worker={"processes": processes, "concurrency": 32, "log_level": "WARNING"},
    )
    supervisor = Supervisor(settings, handle_signals=False)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        if not supervisor.ready.wait(60) or supervisor.url is None:
            raise RuntimeError("service did not start")
        client: Any = redis.Redis.from_url(supervisor.url, decode_responses=True)
        wait_for_workers(client, thread, processes)  # not part of the measurement
        sent: dict[str, float] = {}
        start = time.perf_counter()
        for n in range(messages):
            channel = "im" if n % 2 else "public"
            fields = {"avatar_uuid": avatar(n % avatars), "channel": channel, "text": f"hello {n}"}
            sent[client.xadd("gm:inbound", fields)] = time.perf_counter()
        latencies: list[float] = []
        cursor = "0-0"
        last = start
        with step(sys.stderr, f"{processes} process(es)", messages) as bar:
            while len(latencies) < messages:
                found = client.xread({"gm:outbound": cursor}, count=1000, block=1000)
                now = time.perf_counter()
                for _, entries in found or ():
                    for entry_id, fields in entries:
                        cursor = entry_id
                        if fields["in_reply_to"] in sent:
                            latencies.append(now - sent.pop(fields["in_reply_to"]))
                            last = now
                bar(len(latencies))
                if now - start > 600:
                    raise RuntimeError("too slow: gave up after 600 s")
        client.close()
    finally:
        supervisor.stop()
        thread.join(60)
        if llm:
            llm.stop()
        shutil.rmtree(base, ignore_errors=True)
    ordered = sorted(latencies)
    return {
        "rate": messages / (last - start),
        "p50": statistics.median(ordered) * 1000,
        "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--avatars", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="1,000 messages")
    args = parser.parse_args()
    if args.quick:
        args.messages = 1000
    one = run_case(1, args.messages, args.avatars, None)
    two = run_case(2, args.messages, args.avatars, None)
    slow_messages = 640 if args.quick else 1280  # 20 or 40 rounds of 32 calls of 500 ms
    slow = run_case(1, slow_messages, args.avatars, 0.5)
    burst = f"{args.messages:,} messages over {args.avatars} avatars x 2 channels"
    print(f"\n{burst}, sent as one burst ({slow_messages} for the 500 ms case)\n")
    print(f"{'case':<44} {'messages/s':>11} {'p50 ms':>9} {'p99 ms':>9}")
    rows = [
        ("offline responder, 1 process", one),
        ("offline responder, 2 processes", two),
        ("500 ms endpoint, 1 process, concurrency 32", slow),
    ]
    for name, result in rows:
        print(f"{name:<44} {result['rate']:>11,.0f} {result['p50']:>9,.0f} {result['p99']:>9,.0f}")
    print(f"\nscaling 2 processes / 1 process: {two['rate'] / one['rate']:.2f}")
    print(f"yardstick (500 ms endpoint, target >= 50 messages/s): {slow['rate']:.0f}")


if __name__ == "__main__":
    main()
