"""End-to-end service throughput and latency: inbound stream -> workers -> outbound stream.

    python bench/service.py [--quick] [--base DIR]
    python bench/service.py --clients [--latencies 0.5,2 --concurrencies 32,256,1024]
    python bench/service.py --case L:C[:ROUNDS] | --paced L:C:RATE[:SECONDS]

Runs the real service (supervisor, private Valkey, worker processes) in this
process's background and plays a grid bridge, then reads every reply from the
outbound stream. Latency is from XADD on the inbound stream to the reply's
arrival on the outbound stream (so a burst's latency includes queueing).

Tables (issue 16):
- clients (--clients only): each candidate HTTP client alone (raw HTTP/1.1, httpx
  in pools of 32 and of 4, aiohttp, worker.llm's) against the local endpoint at
  each (L, C): x C/L and the CPU per request; how worker.llm's client was chosen.
- yardstick: a raw HTTP/1.1 client alone (nothing of gridmem), then worker.llm's client, against the
  local endpoint (`python -m worker.localllm`, its own process) with a fixed
  latency L and C requests in flight: requests/s against C / L. It shows the
  endpoint is not what bounds the rows below.
- the L x C grid: one process at concurrency C against that endpoint, 2 x C
  avatars (half public, half IM), a burst of `rounds` x C messages (8 at L < 1 s,
  else 6): messages/s against C / L (target >= 0.9), for the whole burst and
  steady (between its first C replies and its last C: no ramp, no tail), RSS growth of the worker per conversation in
  flight (peak minus idle, over C; target <= 64 KiB), p50/p99, and Redis commands
  per answered message (INFO commandstats before and after, the bench's own
  commands taken off).
- paced: messages sent at 0.8 x the measured ceiling of C = 1,024 (L = 2 s, or
  0.5 s with --quick): p99 (target <= L + 1 s).
- offline responder (no endpoint: CPU only, the CPU ceiling) for 1 and 2
  processes; with --base DIR also those rows of this checkout and of the one in
  DIR (each by its own bench/service.py's run_case, in a process of its own),
  alternating row by row for --rounds rounds, each pair's ratio of messages/s and
  of the workers' CPU per message (their rusage; the machine's load moves it far
  less), and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis

from gridmem.config import LlmSettings
from gridmem.config import Settings
from tests.helpers import avatar
from worker.llm import OpenAICompatible
from worker.progress import step
from worker.service import GROUP
from worker.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


class Endpoint:
    """`python -m worker.localllm --delay L` in its own process (not this one's GIL)."""

    def __init__(self, delay: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "worker.localllm", "--delay", str(delay)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the local endpoint did not start")

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)


async def raw_caller(url: str, rounds: int) -> None:
    """`rounds` chat completions one after another on one kept-alive connection,
    HTTP/1.1 by hand: as little client as can be, so the endpoint is what is measured."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'
    request = (
        f"POST {address.path}/chat/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    for _ in range(rounds):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError("the local endpoint did not answer 200")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length[1]) if length else 0)
    writer.close()


CLIENTS = ("raw", "httpx /32", "httpx /4", "aiohttp", "worker.llm")
CLIENT_NOTES = {
    "raw": "HTTP/1.1 by hand, one connection per caller: the endpoint alone",
    "httpx /32": "httpx, pools of 32 connections (worker.llm's client before issue 16)",
    "httpx /4": "httpx, re-pooled: pools of 4 connections",
    "aiohttp": "aiohttp alone: one session, one TCPConnector of 2 x C",
    "worker.llm": "worker.llm.OpenAICompatible: what a worker uses (deadline, cap, retries)",
}
HELLO = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _httpx_callers(url: str, concurrency: int, rounds: int, size: int) -> tuple[list[Any], Any]:
    """httpx as worker.llm ran it before issue 16: 2 x C connections in pools of
    `size`, keep-alive, TCP_NODELAY; caller i on pool i mod pools."""
    import socket

    import httpx

    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    pools = -(-2 * concurrency // size)
    clients = [
        httpx.AsyncClient(
            timeout=60,
            transport=httpx.AsyncHTTPTransport(
                limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                socket_options=nodelay,
            ),
        )
        for _ in range(pools)
    ]

    async def caller(n: int) -> None:
        for _ in range(rounds):
            response = await clients[n % pools].post(url + "/chat/completions", json=HELLO)
            response.raise_for_status()

    async def close() -> None:
        for client in clients:
            await client.aclose()

    return [caller(n) for n in range(concurrency)], close


def _aiohttp_callers(url: str, concurrency: int, rounds: int) -> tuple[list[Any], Any]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * concurrency))

    async def caller() -> None:
        for _ in range(rounds):
            async with session.post(url + "/chat/completions", json=HELLO) as response:
                response.raise_for_status()
                await response.read()

    return [caller() for _ in range(concurrency)], session.close


def _ours_callers(url: str, concurrency: int, rounds: int) -> tuple[list[Any], Any]:
    settings = LlmSettings(base_url=url, timeout_seconds=60)
    client = OpenAICompatible(settings, connections=2 * concurrency)

    async def caller() -> None:
        for _ in range(rounds):
            await client.complete(HELLO["messages"])

    return [caller() for _ in range(concurrency)], client.aclose


async def calls(kind: str, url: str, concurrency: int, rounds: int) -> tuple[float, float]:
    """C callers of `kind`, each `rounds` requests one after another: requests/s, and
    this process's CPU seconds per request (client set-up included)."""
    cpu = time.process_time()
    if kind == "raw":
        callers, close = [raw_caller(url, rounds) for _ in range(concurrency)], None
    elif kind.startswith("httpx"):
        callers, close = _httpx_callers(url, concurrency, rounds, int(kind.split("/")[1]))
    elif kind == "aiohttp":
        callers, close = _aiohttp_callers(url, concurrency, rounds)
    else:
        callers, close = _ours_callers(url, concurrency, rounds)
    start = time.perf_counter()
    await asyncio.gather(*callers)
    elapsed = time.perf_counter() - start
    if close is not None:
        await close()
    done = concurrency * rounds
    return done / elapsed, (time.process_time() - cpu) / done


def yardstick(
    delay: float, concurrency: int, rounds: int, kinds: tuple[str, ...] = ("raw", "worker.llm")
) -> dict[str, tuple[float, float]]:
    """Each client `kind` alone against a fresh local endpoint (its own process):
    (requests/s over C / L, CPU microseconds per request in this process)."""
    ideal = concurrency / delay
    out = {}
    for kind in kinds:
        with Endpoint(delay) as endpoint:
            rate, cpu = asyncio.run(calls(kind, endpoint.url, concurrency, rounds))
        out[kind] = (rate / ideal, cpu * 1e6)
    return out


def client_table(latencies: list[float], concurrencies: list[int], rounds: int) -> None:
    """The client comparison (issue 16): each candidate alone, x C/L (CPU us/request)."""
    print(f"\nclients alone against the local endpoint (C callers, {rounds} requests each),")
    print(f"x C/L (this process's CPU us per request); load average {os.getloadavg()[0]:.1f}")
    for kind in CLIENTS:
        print(f"  {kind:<11} {CLIENT_NOTES[kind]}")
    print(f"{'L s':>5} {'C':>6} " + " ".join(f"{kind:>16}" for kind in CLIENTS))
    for delay in latencies:
        for c in concurrencies:
            row = yardstick(delay, c, rounds, CLIENTS)
            cells = " ".join(f"{row[k][0]:>8.2f} ({row[k][1]:>5,.0f})" for k in CLIENTS)
            print(f"{delay:>5} {c:>6} {cells}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


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


def commands(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: int(entry["calls"]) for name, entry in stats.items()}


def reads_processed(client: Any) -> int:
    """The server's read events so far: one per request a client writes and then
    waits on (a MULTI ... EXEC written at once is one), so the round trips."""
    return int(client.info("stats")["total_reads_processed"])


def workers(supervisor: Supervisor) -> list[psutil.Process]:
    found = []
    for slot in supervisor._slots:  # the bench looks inside: the worker processes
        if slot.process is not None and slot.process.pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(slot.process.pid))
    return found


def worker_rss(supervisor: Supervisor) -> int:
    total = 0
    for process in workers(supervisor):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def worker_cpu(supervisor: Supervisor) -> float:
    """CPU seconds (user + system) the worker processes have used."""
    total = 0.0
    for process in workers(supervisor):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def send(url: str, messages: int, avatars: int, pace: float | None, sent: dict[str, float]) -> None:
    """The bridge: `messages` XADDs over `avatars` x 2 channels, as fast as it can or
    at `pace` messages/s; each entry's send time goes into `sent`."""
    sender: Any = redis.Redis.from_url(url, decode_responses=True)
    start = time.perf_counter()
    for n in range(messages):
        if pace:
            delay = start + n / pace - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing the load generator, not waiting on behaviour
        channel = "im" if n % 2 else "public"
        fields = {"avatar_uuid": avatar(n % avatars), "channel": channel, "text": f"hi {n}"}
        at = time.perf_counter()
        sent[sender.xadd("gm:inbound", fields)] = at
    sender.close()


def collect(
    client: Any, sent: dict[str, float], messages: int, on_read: Any, label: str
) -> tuple[list[float], list[float], int]:
    """Every reply's latency, the times they arrived, and the XREADs it took."""
    latencies: list[float] = []
    arrivals: list[float] = []
    early: dict[str, float] = {}  # replies read before the sender noted their entry
    cursor, reads, start = "0-0", 0, time.perf_counter()
    with step(sys.stderr, label, messages) as bar:
        while len(latencies) < messages:
            found = client.xread({"gm:outbound": cursor}, count=1000, block=500)
            reads += 1
            now = time.perf_counter()
            for _, entries in found or ():
                for entry_id, fields in entries:
                    cursor = entry_id
                    early[fields["in_reply_to"]] = now
            for entry_id in [e for e in early if e in sent]:
                latencies.append(early[entry_id] - sent.pop(entry_id))
                arrivals.append(early.pop(entry_id))
            on_read(reads)
            bar(len(latencies))
            if now - start > 600:
                raise RuntimeError("too slow: gave up after 600 s")
    return latencies, sorted(arrivals), reads


def steady_rate(arrivals: list[float], concurrency: int) -> float:
    """Messages/s between the first C replies and the last C (0 if the run is too short
    for a middle): a burst's rate without its first wave's ramp (C entries taken,
    claimed and recorded before their calls go out) and its last wave's tail."""
    middle = len(arrivals) - 2 * concurrency
    if middle <= 0:
        return 0.0
    return middle / (arrivals[-concurrency - 1] - arrivals[concurrency - 1])


def run_case(
    processes: int,
    messages: int,
    avatars: int,
    llm_url: str | None,
    *,
    concurrency: int = 32,
    pace: float | None = None,
) -> dict[str, float]:
    """One service run: a burst of `messages` (or `pace` messages/s) over `avatars` x 2 channels."""
    base = Path(tempfile.mkdtemp(prefix="gm-bench-svc-", dir="/tmp"))
    settings = Settings(
        storage_path=base,
        llm={"base_url": llm_url, "timeout_seconds": 60},
        worker={"processes": processes, "concurrency": concurrency, "log_level": "WARNING"},
    )
    supervisor = Supervisor(settings, handle_signals=False)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        if not supervisor.ready.wait(60) or supervisor.url is None:
            raise RuntimeError("service did not start")
        client: Any = redis.Redis.from_url(supervisor.url, decode_responses=True)
        wait_for_workers(client, thread, processes)  # not part of the measurement
        idle_rss = worker_rss(supervisor)
        rss = [idle_rss]

        def sample(reads: int) -> None:
            if reads % 4 == 0:
                rss.append(worker_rss(supervisor))

        before = commands(client)
        reads_before = reads_processed(client)
        cpu_before = worker_cpu(supervisor)
        sent: dict[str, float] = {}
        start = time.perf_counter()
        args = (supervisor.url, messages, avatars, pace, sent)
        sender = threading.Thread(target=send, args=args, daemon=True)
        sender.start()
        label = f"{processes}p C={concurrency}"
        latencies, arrivals, reads = collect(client, sent, messages, sample, label)
        sender.join()
        reads_after = reads_processed(client)
        after = commands(client)
        cpu = worker_cpu(supervisor) - cpu_before
        client.close()
    finally:
        supervisor.stop()
        thread.join(60)
        shutil.rmtree(base, ignore_errors=True)
    peak_rss = max(rss)
    ours = {"xadd": messages, "xread": reads}  # the bench's own; the INFO calls are not counted
    spent = sum(after.values()) - sum(before.values())
    spent -= sum(ours.values()) + after.get("cmdstat_info", 0) - before.get("cmdstat_info", 0)
    # Round trips: the server's read events, less the bench's own (its XADDs and XREADs;
    # commandstats cannot tell them: an FCALL inside a MULTI counts as an FCALL too).
    trips = reads_after - reads_before - messages - reads
    ordered = sorted(latencies)
    return {
        "round_trips": trips / messages,
        "rate": messages / (arrivals[-1] - start),
        "steady": steady_rate(arrivals, concurrency),
        "p50": statistics.median(ordered) * 1000,
        "p99": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
        "rss_per_conversation": (peak_rss - idle_rss) / concurrency,
        "commands": spent / messages,
        # the worker processes' CPU over the run, in cores: near 1 per process, CPU-bound
        "cpu": cpu / (time.perf_counter() - start),
    }


def offline_rate(
    checkout: Path, processes: int, messages: int, avatars: int
) -> tuple[float, float]:
    """One offline row (no endpoint) of the checkout in `checkout`, by that checkout's
    own bench/service.py `run_case` in a process of its own: messages/s, and the
    worker processes' CPU per message in microseconds (their rusage: the workers are
    that process's children, Valkey is not), which the machine's other load moves far
    less than the rate."""
    code = (
        "import resource, runpy; m = runpy.run_path('bench/service.py', run_name='bench'); "
        f"rate = m['run_case']({processes}, {messages}, {avatars}, None)['rate']; "
        "used = resource.getrusage(resource.RUSAGE_CHILDREN); "
        f"print(rate, (used.ru_utime + used.ru_stime) / {messages} * 1e6)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate, cpu = out.split()[-2:]
    return float(rate), float(cpu)


def against_base(base: Path, messages: int, avatars: int, rounds: int) -> None:
    """The offline rows of this checkout and of `base`, alternating row by row (who goes
    first swaps each round, so the machine's drift falls on both): each pair's ratio
    of messages/s and of worker CPU per message (base over this: above 1 is less CPU
    here), and their medians. Every row runs in a fresh process of its own checkout."""
    print(f"\noffline responder, this checkout against {base}, {rounds} alternating rounds")
    print(
        f"{'round':>5} {'processes':>9} {'this msgs/s':>11} {'base msgs/s':>11} {'this/base':>9}"
        f" {'this CPU us/msg':>15} {'base CPU us/msg':>15} {'base/this':>9}"
    )
    ratios: dict[int, list[float]] = {1: [], 2: []}
    cpu_ratios: dict[int, list[float]] = {1: [], 2: []}
    for n in range(rounds):
        for processes in (1, 2):
            sides = [ROOT, base] if n % 2 == 0 else [base, ROOT]
            row = {side: offline_rate(side, processes, messages, avatars) for side in sides}
            (rate, cpu), (base_rate, base_cpu) = row[ROOT], row[base]
            ratios[processes].append(rate / base_rate)
            cpu_ratios[processes].append(base_cpu / cpu)
            print(
                f"{n + 1:>5} {processes:>9} {rate:>11,.0f} {base_rate:>11,.0f}"
                f" {ratios[processes][-1]:>9.2f} {cpu:>15,.0f} {base_cpu:>15,.0f}"
                f" {cpu_ratios[processes][-1]:>9.2f}",
                flush=True,
            )
    for processes, found in ratios.items():
        cpu_found = cpu_ratios[processes]
        print(
            f"this / base, {processes} process{'es' if processes > 1 else ''}: messages/s median"
            f" {statistics.median(found):.2f}x (rounds {min(found):.2f} .. {max(found):.2f});"
            f" worker CPU per message, base / this: median {statistics.median(cpu_found):.2f}x"
            f" ({min(cpu_found):.2f} .. {max(cpu_found):.2f})"
        )


Grid = list[tuple[float, int, dict[str, tuple[float, float]], dict[str, float]]]


def run_grid(
    latencies: list[float], concurrencies: list[int], quick: bool
) -> tuple[Grid, dict[str, float]]:
    """The yardstick and service rows of every (L, C), then the paced run."""
    grid: Grid = []
    for delay in latencies:
        rounds = (4 if quick else 8) if delay < 1 else 6
        for c in concurrencies:
            stick = yardstick(delay, c, 3)
            with Endpoint(delay) as endpoint:
                result = run_case(1, rounds * c, 2 * c, endpoint.url, concurrency=c)
            grid.append((delay, c, stick, result))
    delay = latencies[-1]
    ceiling = next(r["rate"] for d, c, _, r in grid if d == delay and c == concurrencies[-1])
    rate = 0.8 * ceiling
    with Endpoint(delay) as endpoint:
        paced = run_case(
            1,
            int(rate * (8 if quick else 15)),
            2 * concurrencies[-1],
            endpoint.url,
            concurrency=concurrencies[-1],
            pace=rate,
        )
    paced["delay"], paced["pace"] = delay, rate
    return grid, paced


def one_row(case: str | None, paced: str | None) -> None:
    """`--case L:C[:ROUNDS]` or `--paced L:C:RATE[:SECONDS]`: one service row, printed."""
    spec = [float(x) for x in (case or paced or "").split(":")]
    delay, c = spec[0], int(spec[1])
    if case:
        messages, pace = int((spec[2] if len(spec) > 2 else 3) * c), None
    else:
        pace = spec[2]
        messages = int(pace * (spec[3] if len(spec) > 3 else 15))
    load = os.getloadavg()[0]
    with Endpoint(delay) as endpoint:
        r = run_case(1, messages, 2 * c, endpoint.url, concurrency=c, pace=pace)
    kind = f"paced at {pace:,.0f}/s" if pace else f"burst of {messages:,}"
    print(
        f"L = {delay} s, C = {c}, {kind}: {r['rate']:,.0f} messages/s"
        f" ({r['rate'] / (c / delay):.2f} x C/L; steady {r['steady'] / (c / delay):.2f}), p50 {r['p50']:,.0f} ms, p99 {r['p99']:,.0f} ms,"
        f" RSS/conv {r['rss_per_conversation'] / 1024:.1f} KiB, worker CPU {r['cpu']:.2f};"
        f" load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )


def print_grid(grid: Grid, paced: dict[str, float] | None) -> None:
    """The yardstick and L x C tables, and the paced run; the load average with them."""
    print(f"\nload average: {os.getloadavg()[0]:.1f}")
    if grid:
        print(
            "\nyardstick: a raw HTTP/1.1 client alone against the local endpoint (C callers, 3 requests each)"
        )
        print(
            f"{'L s':>5} {'C':>6} {'requests/s':>11} {'C/L':>7} {'ratio':>6} {'worker.llm client ratio':>24}"
        )
        for delay, c, stick, _ in grid:
            print(
                f"{delay:>5} {c:>6} {stick['raw'][0] * c / delay:>11,.0f} {c / delay:>7,.0f} {stick['raw'][0]:>6.2f} {stick['worker.llm'][0]:>24.2f}"
            )
        print("\nL x C: 1 worker process, concurrency C, 2 x C avatars, one burst; ratio: the")
        print(
            "burst's messages/s over C / L; steady: the same between its first and last C replies"
        )
        head = f"{'L s':>5} {'C':>6} {'msgs/s':>8} {'C/L':>7} {'ratio':>6} {'steady':>6} {'p50 ms':>8} {'p99 ms':>8} {'RSS/conv KiB':>13} {'cmds/msg':>9} {'trips/msg':>9} {'worker CPU':>10}"
        print(head)
        for delay, c, _, r in grid:
            print(
                f"{delay:>5} {c:>6} {r['rate']:>8,.0f} {c / delay:>7,.0f} {r['rate'] / (c / delay):>6.2f} {r['steady'] / (c / delay):>6.2f}"
                f" {r['p50']:>8,.0f} {r['p99']:>8,.0f} {r['rss_per_conversation'] / 1024:>13,.1f} {r['commands']:>9.1f} {r['round_trips']:>9.1f} {r['cpu']:>10.2f}"
            )
    if paced:
        print(
            f"\npaced at 0.8 x the C = 1,024 ceiling ({paced['pace']:,.0f} messages/s, L = {paced['delay']} s):"
            f" {paced['rate']:,.0f} messages/s, p50 {paced['p50']:,.0f} ms, p99 {paced['p99']:,.0f} ms"
            f" (target <= {(paced['delay'] + 1) * 1000:,.0f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3000, help="offline rows' burst")
    parser.add_argument("--avatars", type=int, default=600, help="offline rows' avatars")
    parser.add_argument("--quick", action="store_true", help="L = 0.5 s only, shorter bursts")
    parser.add_argument("--base", type=Path, help="a checkout to compare the offline rows with")
    parser.add_argument("--no-grid", action="store_true", help="offline rows only")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds against --base (default 3)"
    )
    parser.add_argument(
        "--clients", action="store_true", help="the HTTP client comparison only (issue 16)"
    )
    parser.add_argument(
        "--case",
        metavar="L:C[:ROUNDS]",
        help="one L x C burst row only (ROUNDS x C messages; default 3)",
    )
    parser.add_argument(
        "--paced",
        metavar="L:C:RATE[:SECONDS]",
        help="one paced row only: RATE messages/s for SECONDS (default 15)",
    )
    parser.add_argument("--latencies", help="comma-separated L values, seconds")
    parser.add_argument("--concurrencies", help="comma-separated C values")
    args = parser.parse_args()
    if args.quick:
        args.messages = 1000
    latencies = [0.5] if args.quick else [0.5, 2.0]
    concurrencies = [32, 256, 1024]
    if args.latencies:
        latencies = [float(x) for x in args.latencies.split(",")]
    if args.concurrencies:
        concurrencies = [int(x) for x in args.concurrencies.split(",")]
    if args.clients:
        client_table(latencies, concurrencies, 3)
        return
    if args.case or args.paced:
        one_row(args.case, args.paced)
        return

    grid, paced = ([], None) if args.no_grid else run_grid(latencies, concurrencies, args.quick)
    one = run_case(1, args.messages, args.avatars, None)
    two = run_case(2, args.messages, args.avatars, None)

    print_grid(grid, paced)
    burst = f"{args.messages:,} messages over {args.avatars} avatars x 2 channels, one burst"
    print(f"\noffline responder (no endpoint; the CPU ceiling), {burst}")
    print(
        f"{'case':<32} {'messages/s':>11} {'p50 ms':>9} {'p99 ms':>9} {'cmds/msg':>9} {'trips/msg':>9}"
    )
    for name, r in (("1 process", one), ("2 processes", two)):
        print(
            f"{name:<32} {r['rate']:>11,.0f} {r['p50']:>9,.0f} {r['p99']:>9,.0f} {r['commands']:>9.1f} {r['round_trips']:>9.1f}"
        )
    print(f"scaling 2 processes / 1 process: {two['rate'] / one['rate']:.2f}")
    if args.base:
        against_base(args.base, args.messages, args.avatars, args.rounds)


if __name__ == "__main__":
    main()
