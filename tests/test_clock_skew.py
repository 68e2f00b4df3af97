"""Hosts with skewed wall clocks share one store without shortening sessions (DESIGN section 4).

The store keeps one clock offset per boot id, fixed at that boot's first write
from the shard's epoch (store time minus wall time, fixed at its first write).
Regression tests for issue 12 item 4: one shared offset, re-based from the wall
clock at every switch of writer, added the skew at every switch, so two hosts 2 s
apart alternating every 500 ms expired a 30-minute session after 10 minutes; and
new boots started from the wall clock of whichever host wrote last, so restarts
alternating between two hosts added the skew at every other boot.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import redis as redis_py

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import ReasonCode
from gridmem.clock import DEFAULT_MANUAL_WALL_MS
from gridmem.clock import MAX_CLOCK_BOOTS
from gridmem.keys import KeySpace
from gridmem.records import CHANNEL_TTL_MS
from tests.helpers import avatar

A = avatar(1)
TTL = CHANNEL_TTL_MS[Channel.PUBLIC]
CLOCK_KEY = KeySpace().shard(0).clock
SKEWS = [2_000, -2_000]  # host A's wall clock ahead of host B's, then behind
VIEWS = ("context", "read_page", "list_metadata", "receipt")


class Host:
    """One host: its own boot id, monotonic origin and wall clock, one store."""

    def __init__(self, redis: redis_py.Redis, boot: str, mono: int, wall: int) -> None:
        self.clock = ManualClock(monotonic_ms=mono, wall_ms=wall, boot_id=boot)
        self.store = ConversationStore(redis, clock=self.clock)

    def write(self, n: int) -> str:
        record = AvatarMessage(text=f"turn {n}")
        return self.store.record(A, "public", record, idempotency_key=f"k{n}").session_id

    def views(self, last: int) -> dict[str, bool]:
        """Is the session alive, as each read that applies the clock rule sees it?
        `last` numbers the last write (its receipt is kept, older ones may be folded)."""
        return {
            "context": bool(self.store.context(A, "public")),  # gridmem/reads.py
            "read_page": bool(self.store.read_page(A, "public").turns),
            "list_metadata": any(m.avatar_uuid == A for m in self.store.list_metadata().items),
            "receipt": self.store.receipt(A, "public", f"k{last}") is not None,
        }


def two_hosts(redis: redis_py.Redis, skew: int) -> tuple[Host, Host, Callable[[int], None]]:
    """Hosts A and B whose wall clocks differ by `skew` ms and whose monotonic clocks
    are unrelated; returns them and a function moving real time on for both."""
    a = Host(redis, "host-a", 123_456, DEFAULT_MANUAL_WALL_MS + skew)
    b = Host(redis, "host-b", 987_654_321, DEFAULT_MANUAL_WALL_MS)

    def advance(ms: int) -> None:
        a.clock.advance(ms)
        b.clock.advance(ms)

    return a, b, advance


def assert_alive(hosts: list[Host], alive: bool, last: int) -> None:
    for host in hosts:
        assert host.views(last) == dict.fromkeys(VIEWS, alive)


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("target_writer", ["a", "b"])
def test_two_hosts_alternating_for_20_minutes_leave_a_30_minute_session_alive(
    redis: redis_py.Redis, skew: int, target_writer: str
) -> None:
    # Given host A wrote first, host B joined 10 s later, and one of them then
    # wrote the session under test once (elapsed time 0 below)
    a, b, advance = two_hosts(redis, skew)
    busy = avatar(3)
    a.store.record(busy, "public", AvatarMessage(text="first"))
    advance(10_000)
    b.store.record(busy, "public", AvatarMessage(text="joined"))
    (a if target_writer == "a" else b).write(0)
    elapsed, turn = 0, 0

    def alternate_until(moment: int) -> None:
        """Both hosts write another session in turn, every 500 ms, until `moment`."""
        nonlocal elapsed, turn
        while elapsed < moment:
            step = min(500, moment - elapsed)
            advance(step)
            elapsed += step
            if step == 500:
                host = (a, b)[turn % 2]
                host.store.record(busy, "public", AvatarMessage(text=f"busy {turn}"))
                turn += 1

    # When the two hosts alternate writes for 20 minutes
    alternate_until(20 * 60_000)
    # Then the session is alive from both hosts' views
    assert_alive([a, b], True, 0)
    # and, while they go on alternating, until 30 minutes minus the skew after its
    # write; by 30 minutes plus the skew it is gone from both
    alternate_until(TTL - abs(skew) - 1)
    assert_alive([a, b], True, 0)
    assert a.store.sweep() == b.store.sweep() == 0
    alternate_until(TTL + abs(skew))
    assert_alive([a, b], False, 0)
    # ended once: by the busy writes (each expires a few idle sessions), else the sweep
    a.store.sweep(), b.store.sweep()
    ended = [e for e in a.store.events(count=1000) if e.reason is ReasonCode.EXPIRED_INACTIVITY]
    assert [e.avatar_uuid for e in ended] == [A]
    assert turn > 2 * 30 * 60 * 0.99  # they did alternate all along


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("last_writer", ["a", "b"])
def test_a_skew_moves_a_session_end_by_exactly_the_skew_at_most(
    redis: redis_py.Redis, skew: int, last_writer: str
) -> None:
    # Given hosts A and B, 2 s apart, that have written in turn
    a, b, advance = two_hosts(redis, skew)
    a.write(0)
    advance(10_000)
    for n in range(20):
        (b, a)[n % 2].write(n)
        advance(500)
    # When one of them writes last, alone
    writer, other = (a, b) if last_writer == "a" else (b, a)
    advance(10_000)
    writer.write(99)
    # Then the writer sees exactly the TTL, and the other host the TTL moved by the
    # skew between them: A's wall clock is `skew` ahead of B's
    other_life = TTL + (skew if last_writer == "a" else -skew)
    assert abs(other_life - TTL) == abs(skew)
    ends = sorted([(TTL, writer), (other_life, other)], key=lambda end: end[0])
    elapsed = 0
    for life, host in ends:
        advance(life - 1 - elapsed)
        assert_alive([host], True, 99)
        advance(1)
        assert_alive([host], False, 99)
        elapsed = life


def test_a_wall_clock_step_on_a_known_boot_moves_nothing(redis: redis_py.Redis) -> None:
    """A boot's offset is fixed at its first write: its wall clock no longer matters."""
    a, b, advance = two_hosts(redis, 0)
    a.write(0)
    advance(1_000)
    b.write(1)
    # When both wall clocks jump, one forward an hour and one back a day
    a.clock.set_wall(a.clock.wall_ms() + 3_600_000)
    b.clock.set_wall(b.clock.wall_ms() - 86_400_000)
    # Then the session still ends exactly one TTL after the last write, for both
    advance(TTL - 1)
    assert_alive([a, b], True, 1)
    advance(1)
    assert_alive([a, b], False, 1)


def clock_boots(redis: redis_py.Redis) -> set[str]:
    fields = [f.decode() for f in redis.hkeys(CLOCK_KEY)]
    offsets = {f[2:] for f in fields if f.startswith("o:")}
    assert offsets == {f[2:] for f in fields if f.startswith("s:")}
    return offsets


def test_the_boot_table_keeps_the_most_recently_seen_boots(redis: redis_py.Redis) -> None:
    # Given boot-000 wrote first and then at every step, while MAX_CLOCK_BOOTS other
    # boots wrote once each, a second apart (all wall clocks agree)
    wall = DEFAULT_MANUAL_WALL_MS
    sid = Host(redis, "boot-000", 0, wall).write(0)
    for n in range(1, MAX_CLOCK_BOOTS + 1):
        Host(redis, f"boot-{n:03d}", 1_000 * n, wall + 1_000 * n).write(n)
        Host(redis, "boot-000", 1_000 * n, wall + 1_000 * n).write(n)
    # Then the table holds the MAX_CLOCK_BOOTS most recently seen: boot-001 is
    # forgotten, not boot-000, which was seen first but also last
    expected = {f"boot-{n:03d}" for n in range(MAX_CLOCK_BOOTS + 1)} - {"boot-001"}
    assert clock_boots(redis) == expected
    # When boot-001 comes back: its monotonic clock moved 1 s since its only write,
    # its wall clock 10 minutes past the store's last write
    last_wall = wall + 1_000 * MAX_CLOCK_BOOTS
    back = Host(redis, "boot-001", 2_000, last_wall + 600_000)
    # Then it is a new boot: its time goes on from the store's by the wall time since,
    # so the session (last written at last_wall) has 20 minutes left
    back.clock.advance(TTL - 600_000 - 1)
    assert back.store.context(A, "public")
    back.clock.advance(1)
    assert back.store.context(A, "public") == []
    assert back.write(99) != sid
    assert clock_boots(redis) == expected - {"boot-002"} | {"boot-001"}


def test_an_older_versions_clock_is_taken_over(redis: redis_py.Redis) -> None:
    """The single offset of earlier versions ('boot', 'offset') goes at the next new boot;
    'last' and 'wall' mean the same, so the store's time carries on from them, and the
    epoch they imply (last - wall) is fixed."""
    # Given a session written under an older version's clock hash
    Host(redis, "old", 50_000, 10_000).write(0)
    redis.hdel(CLOCK_KEY, "o:old", "s:old")
    redis.hset(CLOCK_KEY, mapping={"boot": "old", "offset": 0})
    # Then a new boot counts the wall time since its last write
    host = Host(redis, "new", 0, 10_000 + TTL - 1)
    assert host.store.context(A, "public")
    host.clock.advance(1)
    assert host.store.context(A, "public") == []
    assert host.store.record(A, "public", AvatarMessage(text="x")).new_session
    clock = redis.hgetall(CLOCK_KEY)
    assert set(clock) == {b"epoch", b"last", b"wall", b"o:new", b"s:new"}
    # and the epoch it fixes is the one the old 'last' and 'wall' implied
    assert int(clock[b"epoch"]) == 50_000 - 10_000


D = 2_000  # the largest skew between a host's wall clock and the first writer's


class Fleet:
    """Hosts whose wall clocks are off by fixed skews (host 0, the first writer, by
    none), each restarted on demand as a new boot with an unrelated monotonic clock;
    `t` is real time since the start, and moves on for every running boot."""

    def __init__(self, redis: redis_py.Redis, skews: list[int], seed: int) -> None:
        self.redis, self.skews, self.t = redis, skews, 0
        self.rng = random.Random(seed)
        self.running: dict[int, Host] = {}
        self.boots = 0

    def boot(self, h: int) -> Host:
        self.boots += 1
        mono = self.rng.randrange(0, 10**9)
        wall = DEFAULT_MANUAL_WALL_MS + self.t + self.skews[h]
        self.running[h] = Host(self.redis, f"host{h}-boot{self.boots}", mono, wall)
        return self.running[h]

    def advance(self, ms: int) -> None:
        self.t += ms
        for host in self.running.values():
            host.clock.advance(ms)

    def store_time(self, host: Host) -> int:
        """The store time `host` last wrote at (its boot's s:<boot> field)."""
        return int(self.redis.hget(CLOCK_KEY, "s:" + host.clock.boot_id()))

    def busy_write(self, host: Host, n: int) -> int:
        host.store.record(avatar(3), "public", AvatarMessage(text=f"busy {n}"))
        return self.store_time(host)


def assert_session_ends_within_d(fleet: Fleet) -> None:
    """The 30-minute session written at t=0 (turn k0) is alive, from every running
    host, until 30 minutes minus D, and gone from all of them by 30 minutes plus D."""
    hosts = list(fleet.running.values())
    fleet.advance(TTL - D - 1 - fleet.t)
    assert_alive(hosts, True, 0)
    assert sum(host.store.sweep() for host in hosts) == 0
    fleet.advance(2 * D + 1)
    assert_alive(hosts, False, 0)
    assert sum(host.store.sweep() for host in hosts) == 1


@pytest.mark.parametrize("skew", SKEWS)
def test_new_boots_alternating_between_two_hosts_never_accumulate_skew(
    redis: redis_py.Redis, skew: int
) -> None:
    """Regression (issue 12 item 4, second pass): a new boot's offset came from
    `last + max(0, wall - last_wall)`, `wall` being the clock of whichever host wrote
    `last`, so each new boot on the host that is ahead, after a write by the other,
    started the skew further ahead: 100 restarts alternating moved store time ~50 d."""
    # Given host 0 (the first writer) and host 1, whose wall clock is `skew` behind
    fleet = Fleet(redis, [0, -skew], seed=1)
    first = fleet.boot(0)
    first.write(0)  # the 30-minute session under test, at t=0
    base = fleet.store_time(first)
    # When the two hosts restart in turn, 100 boots in all, each writing once
    for n in range(1, 100):
        fleet.advance(17_000)
        host = fleet.boot(n % 2)
        # Then every boot's store time stays within D of the first writer's clock
        assert abs(fleet.busy_write(host, n) - (base + fleet.t)) <= D, n
    assert fleet.boots == 100
    # and the session written at the start ends between TTL - D and TTL + D
    assert_session_ends_within_d(fleet)


@pytest.mark.parametrize("seed", [3, 5, 8])
def test_many_hosts_of_random_skew_keep_store_time_within_d(
    redis: redis_py.Redis, seed: int
) -> None:
    # Given 8 hosts whose wall clocks are within D of the first writer's (host 0)
    rng = random.Random(seed)
    skews = [0] + [rng.randint(-D, D) for _ in range(7)]
    skews[1:3] = [D, -D]  # the extremes, always
    fleet = Fleet(redis, skews, seed)
    first = fleet.boot(0)
    first.write(0)
    base = fleet.store_time(first)
    # When for 25 minutes, at random moments, a random host restarts or a running
    # one writes (150 boots: far past the MAX_CLOCK_BOOTS table, so boots are forgotten)
    while fleet.boots < 150:
        fleet.advance(rng.randrange(0, 6_000))
        assert fleet.t < 25 * 60_000
        h = rng.randrange(len(skews))
        restart = h not in fleet.running or rng.random() < 0.5
        host = fleet.boot(h) if restart else fleet.running[h]
        # Then no write moves store time more than D from the first writer's clock
        assert abs(fleet.busy_write(host, fleet.boots) - (base + fleet.t)) <= D
    assert len(clock_boots(redis)) == MAX_CLOCK_BOOTS
    # and the session written at the start ends between TTL - D and TTL + D
    assert_session_ends_within_d(fleet)


def test_a_new_boot_whose_wall_clock_is_behind_starts_at_the_stores_time(
    redis: redis_py.Redis,
) -> None:
    """Store time never goes backwards: a new boot with a wall clock a day behind
    starts at the store's latest time (wall + epoch would be a day before it)."""
    # Given a session written at t=0, and the store's latest write 10 s later
    fleet = Fleet(redis, [0, -86_400_000], seed=2)
    first = fleet.boot(0)
    first.write(0)
    fleet.advance(10_000)
    latest = fleet.busy_write(first, 1)
    # When a host whose wall clock is a day behind boots and writes
    fleet.advance(5_000)
    behind = fleet.boot(1)
    # Then its time starts where the store's was (a behind wall clock counts as no time)
    assert fleet.busy_write(behind, 2) == latest
    # and the session, 15 s old in real time but 10 s old for it, lives 5 s longer there
    behind.clock.advance(TTL - 10_000 - 1)
    assert behind.views(0) == dict.fromkeys(VIEWS, True)
    behind.clock.advance(1)
    assert behind.views(0) == dict.fromkeys(VIEWS, False)
