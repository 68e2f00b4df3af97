"""context()'s read: one MULTI/EXEC of plain reads, the liveness rule it applies, and
the cache of decoded entries.

The rule exists twice (lib.lua for the scripts, gridmem/reads.py for this read),
so the two are checked against each other on the same stored states.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis as redis_py

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.clock import MAX_BOOT_ID_CHARS
from gridmem.context import ENTRY_CACHE
from gridmem.context import EntryCache
from gridmem.context import context_messages
from gridmem.errors import BadScriptArgument
from gridmem.errors import CorruptRecord
from gridmem.keys import KeySpace
from gridmem.library import lib_source
from gridmem.reads import check_clock
from gridmem.reads import clock_fields
from gridmem.reads import context_read
from gridmem.reads import is_live
from gridmem.reads import live_now
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import Channel
from gridmem.scripts import ClockReading
from tests.helpers import avatar

pytestmark = pytest.mark.both_doors  # every store test, through both doors

A = avatar(1)
TTL = CHANNEL_TTL_MS[Channel.PUBLIC]
KEYSPACE = KeySpace()
SESSION, SHARD = KEYSPACE.session(A, Channel.PUBLIC)

# lib.lua's own store_now (read-only) and is_expired, run on the server.
LUA_RULE = (
    lib_source()
    + """
local now = store_now(KEYS[1], ARGV[3], tonumber(ARGV[1]), tonumber(ARGV[2]), false)
local expired = is_expired(KEYS[2], ARGV[4], ARGV[5], now)
return {string.format('%.17g', now), expired and 1 or 0}
"""
)


def lua_rule(redis: redis_py.Redis, reading: ClockReading, channel: Channel) -> tuple[str, bool]:
    member = f"{A}:{channel.value}"
    now, expired = redis.eval(
        LUA_RULE, 2, SHARD.clock, SHARD.lru(channel), *reading.args(), member, channel.value
    )
    return now.decode(), bool(expired)


def python_rule(redis: redis_py.Redis, reading: ClockReading, channel: Channel) -> tuple[str, bool]:
    # store time compared as the double both compute, all 17 digits
    fields = redis.hmget(SHARD.clock, *clock_fields(reading.boot))
    now = live_now(fields, reading)
    last_active = redis.zscore(SHARD.lru(channel), f"{A}:{channel.value}")
    return f"{now:.17g}", not is_live(last_active, now, CHANNEL_TTL_MS[channel])


# Clock hashes as lib.lua store_now writes them (epoch, last, wall, o:<boot>, s:<boot>),
# as older versions left them (boot, offset), and damaged from outside.
CLOCK_STATES: list[dict[str, Any]] = [
    {},  # a store no worker has written
    {"last": 5_000, "wall": 1_000_000, "o:boot-a": 0, "s:boot-a": 5_000},
    {"last": 9_000, "wall": 1_000_000, "o:boot-a": -4_000, "s:boot-a": 9_000},
    # two boots known, boot-b's time 2 s behind boot-a's
    {"last": 9_000, "wall": 1_000_000, "o:boot-a": -4_000, "o:boot-b": 70, "s:boot-b": 7_000},
    {"last": 5_000, "o:boot-b": 70},  # no wall recorded
    {"wall": 1_000_000, "o:boot-a": 100},  # no last recorded
    {"boot": "boot-a", "offset": 70, "last": 5_000, "wall": 1_000_000},  # an older version's
    {"last": "junk", "wall": "junk", "o:boot-a": "junk", "o:boot-b": "junk"},
    # numbers Python's float() or int() take and Lua's tonumber() may not, or the reverse:
    # the rule counts decimal integers only, in ASCII digits
    {"last": "5000.5", "wall": " 1000000", "o:boot-a": "0x10", "o:boot-b": "1_000"},
    {"last": "1e3", "wall": "inf", "o:boot-a": "\u0665\u0660", "o:boot-b": "\uff17"},
    {"last": "+5000", "wall": "-0", "o:boot-a": "-00070", "o:boot-b": "70\n"},
    {"last": "", "wall": "1000000", "o:boot-a": "", "o:boot-b": "99999999999999999999"},
    # with the shard's epoch (store time minus wall time, fixed at its first write):
    # a new boot starts at wall + epoch, or at last if that is later
    {"epoch": -995_000, "last": 5_000, "wall": 1_000_000, "o:boot-a": 0, "s:boot-a": 5_000},
    {"epoch": -990_000, "last": 9_000, "wall": 1_000_000, "o:boot-a": -4_000},
    {"epoch": -1_000_000, "last": 9_000, "wall": 1_000_000, "o:boot-b": 70},  # last is ahead
    {"epoch": 0, "last": 5_000},  # epoch 0: store time is wall time
    {"epoch": -995_000},  # an epoch but no last
    {"epoch": 1_000, "last": 5_000, "wall": 1_000_000},  # store time 1 s ahead of wall
    {"epoch": "junk", "last": 5_000, "wall": 1_000_000},  # damaged: derived from last, wall
    {"epoch": "-1e6", "last": 5_000},  # damaged, nothing to derive it from: start at last
    {"epoch": "-99999999999999999999", "last": 5_000, "wall": 1_000_000},
    {"epoch": "-00995000", "last": "+5000", "o:boot-a": "\uff17"},
]
READINGS = [
    ClockReading(mono, wall, boot)
    for boot in ("boot-a", "boot-b", "boot-c")
    for mono in (0, 4_000, 5_000 + TTL - 1, 5_000 + TTL, 900_000_000)
    for wall in (0, 1_000_000, 1_000_000 + TTL - 1, 1_000_000 + TTL)  # incl. wall going back
]
LAST_ACTIVE = [None, 0, 5_000, 9_000, 5_000 + TTL]


@pytest.mark.parametrize("state", CLOCK_STATES)
def test_python_rule_matches_lib_lua(redis: redis_py.Redis, state: dict[str, Any]) -> None:
    if state:
        redis.hset(SHARD.clock, mapping=state)
    answers = set()
    for last in LAST_ACTIVE:
        redis.delete(SHARD.lru_public, SHARD.lru_im)
        if last is not None:
            redis.zadd(SHARD.lru_public, {f"{A}:public": last})
            redis.zadd(SHARD.lru_im, {f"{A}:im": last})
        for reading in READINGS:
            for channel in Channel:
                expected = lua_rule(redis, reading, channel)
                assert python_rule(redis, reading, channel) == expected, (last, reading, channel)
                answers.add(expected[1])
    assert answers == {True, False}  # agreement on both answers, not on a constant


def test_expiry_boundary_is_exact(store: ConversationStore, clock: ManualClock) -> None:
    store.record(A, "public", AvatarMessage(text="hi"))
    clock.advance(TTL - 1)
    assert [m.content for m in store.context(A, "public")] == ["hi"]
    clock.advance(1)
    assert store.context(A, "public") == []


def test_another_boot_counts_wall_time(store: ConversationStore, clock: ManualClock) -> None:
    store.record(A, "im", AvatarMessage(text="hi"))
    rebooted = ManualClock(monotonic_ms=0, wall_ms=clock.wall_ms() + 3_600_000, boot_id="boot-2")
    other = ConversationStore(store.redis, store.config, clock=rebooted)
    assert len(other.context(A, "im")) == 1  # one hour of a 24-hour TTL
    rebooted.advance(CHANNEL_TTL_MS[Channel.IM] - 3_600_000)
    assert other.context(A, "im") == []


def test_summary_and_entries_in_order(store: ConversationStore, redis: redis_py.Redis) -> None:
    assert store.context(A, "public") == []
    store.record(A, "public", AvatarMessage(text="hi"))
    store.record(A, "public", AgentReply(text="hello"))
    redis.set(SESSION.summary, "- (untrusted) resident said: earlier")
    messages = [(m.role, m.content) for m in store.context(A, "public")]
    assert messages[1:] == [("user", "hi"), ("assistant", "hello")]
    assert messages[0][0] == "user" and messages[0][1].endswith("resident said: earlier")


@pytest.mark.real
def test_one_transaction_per_read(real_redis: redis_py.Redis) -> None:
    store = ConversationStore(real_redis, clock=ManualClock())
    store.record(A, "public", AvatarMessage(text="hi"))
    real_redis.config_resetstat()
    for _ in range(3):
        store.context(A, "public")
    stats = real_redis.info("commandstats")
    assert stats["cmdstat_multi"]["calls"] == stats["cmdstat_exec"]["calls"] == 3
    assert stats["cmdstat_zrange"]["calls"] == 3
    assert not any(name.startswith(("cmdstat_fcall", "cmdstat_eval")) for name in stats)


def test_read_commands_share_one_slot() -> None:
    """MULTI/EXEC on a cluster needs every key in one slot: the shard's hash tag."""
    for shards in (1, 4):
        space = KeySpace("gm", shards)
        session, shard = space.session(A, Channel.IM)
        call = context_read(session, shard, Channel.IM, ClockReading(0, 0, "b"))
        keys = [command[1] for command in call.commands]
        tags = {re.search(r"\{([^}]*)\}", str(k)).group(1) for k in keys}  # type: ignore[union-attr]
        assert tags == {space.tags[shard.shard]}


@pytest.mark.parametrize(
    ("reading", "field"),
    [
        (ClockReading(-1, 0, "b"), "now_mono"),
        (ClockReading(0, -5, "b"), "now_wall"),
        (ClockReading(0, 0, "has space"), "boot_id"),
        (ClockReading(0, 0, ""), "boot_id"),
        (ClockReading(0, 0, "b" * (MAX_BOOT_ID_CHARS + 1)), "boot_id"),
        (ClockReading(0, 0, "b\u0663"), "boot_id"),  # an Arabic-Indic digit is not [0-9]
    ],
)
def test_bad_clock_is_refused_before_redis(
    redis: redis_py.Redis, command_counter: Any, reading: ClockReading, field: str
) -> None:
    class BadClock(ManualClock):
        def monotonic_ms(self) -> int:
            return reading.mono

        def wall_ms(self) -> int:
            return reading.wall

        def boot_id(self) -> str:
            return reading.boot

    store = ConversationStore(redis, clock=BadClock())
    with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
        store.context(A, "public")
    assert command_counter.commands == []


ARG_CLOCK = (
    lib_source()
    + """
local args = new_args()
local mono, wall, boot = args:clock(ARGV[1], ARGV[2], ARGV[3])
local err = args:error()
if err then return err end
return boot
"""
)


@pytest.mark.parametrize(
    ("boot", "accepted"),
    [
        ("b" * MAX_BOOT_ID_CHARS, True),
        ("a-Z_0.9", True),
        ("b" * (MAX_BOOT_ID_CHARS + 1), False),
        ("b\u0663", False),
        ("b:c", False),
        ("", False),
    ],
)
def test_lua_and_python_take_the_same_boot_ids(
    redis: redis_py.Redis, boot: str, accepted: bool
) -> None:
    """A boot id names clock hash fields (o:<boot>): short, and the same rule on both sides."""
    try:
        check_clock(ClockReading(0, 0, boot))
        python = True
    except BadScriptArgument:
        python = False
    try:
        lua = redis.eval(ARG_CLOCK, 0, 0, 0, boot) == boot.encode()
    except redis_py.ResponseError as exc:
        assert "GM_BADARG boot_id" in str(exc)
        lua = False
    assert (python, lua) == (accepted, accepted)


def test_an_error_inside_exec_is_raised_and_the_client_goes_on(
    store: ConversationStore, redis: redis_py.Redis
) -> None:
    store.record(A, "public", AvatarMessage(text="hi"))
    redis.delete(SESSION.summary)
    redis.lpush(SESSION.summary, "not a string")  # damaged from outside
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
        store.context(A, "public")
    redis.delete(SESSION.summary)
    assert [m.content for m in store.context(A, "public")] == ["hi"]


@pytest.mark.real
def test_single_connection_client(real_servers: Any) -> None:
    client = real_servers["valkey"].client(single_connection_client=True)
    client.flushall()
    store = ConversationStore(client, clock=ManualClock())
    store.record(A, "public", AvatarMessage(text="hi"))
    assert [m.content for m in store.context(A, "public")] == ["hi"]
    assert client.connection is not None and client.ping()
    client.close()


# -- the entry cache (gridmem/context.py) -------------------------------------------


def test_a_kept_entry_is_still_refused_in_another_session(
    store: ConversationStore, redis: redis_py.Redis
) -> None:
    ENTRY_CACHE.clear()
    store.record(A, "public", AvatarMessage(text="mine"))
    for _ in range(2):  # the second read keeps the entries (see test_admission)
        assert len(store.context(A, "public")) == 1
    [entry] = redis.zrange(SESSION.turns, 0, -1)
    assert entry in ENTRY_CACHE._kept
    other = avatar(2)
    store.record(other, "public", AvatarMessage(text="theirs"))
    other_turns = KEYSPACE.session(other, Channel.PUBLIC)[0].turns
    redis.zadd(other_turns, {entry: 99})  # A's entry, planted in B's transcript
    for _ in range(2):
        with pytest.raises(CorruptRecord):
            store.context(other, "public")


@pytest.mark.parametrize(
    "planted",
    [b"5|1|" + b"a" * 32 + b'|["a",1]', b"5|1|" + b"a" * 32 + b'|["q","x"]', b"\xff\xfe|1|x|[]"],
)
def test_a_malformed_entry_fails_every_read_and_is_not_kept(
    store: ConversationStore, redis: redis_py.Redis, planted: bytes
) -> None:
    store.record(A, "public", AvatarMessage(text="hi"))
    redis.zadd(SESSION.turns, {planted: 5})
    for _ in range(3):
        with pytest.raises(CorruptRecord):
            store.context(A, "public")
    assert planted not in ENTRY_CACHE._kept


def test_kept_and_fresh_decoding_agree(store: ConversationStore) -> None:
    store.record(A, "public", AvatarMessage(text="hi"))
    store.record(A, "public", ToolSummary(tool="web.fetch", summary="a page"))
    store.record(A, "public", ActionResult(action="give", status="failed", detail="no perm"))
    store.record(A, "public", AgentReply(text="sorry"))
    ENTRY_CACHE.clear()
    fresh = store.context(A, "public")
    assert store.context(A, "public") == fresh and len(ENTRY_CACHE) == 4  # kept now
    assert store.context(A, "public") == fresh  # from the cache
    assert [m.role for m in fresh] == ["user", "user", "user", "assistant"]


SID_A, SID_B = "a" * 32, "b" * 32


def _entries(sid: str, first: int, count: int, text: str = "m") -> list[str]:
    return [f'{n}|1|{sid}|["a","{text}{n}"]' for n in range(first, first + count)]


def read(cache: EntryCache, entries: list[str], sid: str) -> list[str]:
    return [m.content for m in context_messages("", entries, sid, cache)]


def test_admission_keeps_a_session_read_again_within_the_cache() -> None:
    cache = EntryCache(size=10, max_entry=100)
    a, b = _entries(SID_A, 0, 3), _entries(SID_B, 0, 3)
    assert read(cache, a, SID_A) == ["m0", "m1", "m2"]
    assert len(cache) == 0  # read once: nothing kept
    read(cache, b, SID_B)
    assert read(cache, a, SID_A) == ["m0", "m1", "m2"]  # 6 entries read since: within 10
    assert list(cache._kept) == a
    assert read(cache, a + _entries(SID_A, 3, 1), SID_A) == ["m0", "m1", "m2", "m3"]
    assert list(cache._kept) == [*a, *_entries(SID_A, 3, 1)]  # the new entry too


def test_admission_keeps_nothing_when_more_sessions_rotate_than_fit() -> None:
    cache = EntryCache(size=10, max_entry=100)
    sessions = [(f"{n:032x}", _entries(f"{n:032x}", 0, 3)) for n in range(4)]  # 12 > 10
    for _ in range(3):
        for sid, entries in sessions:
            assert read(cache, entries, sid) == ["m0", "m1", "m2"]
    assert len(cache) == 0
    assert len(cache._last_read) <= 10


def test_the_cache_is_bounded() -> None:
    cache = EntryCache(size=3, max_entry=60)
    for n in range(5):
        for _ in range(2):
            assert read(cache, _entries(SID_A, n, 1), SID_A) == [f"m{n}"]
    assert list(cache._kept) == [e for n in range(2, 5) for e in _entries(SID_A, n, 1)]
    long = _entries(SID_A, 9, 1, "x" * 60)
    for _ in range(2):
        assert read(cache, long, SID_A) == ["x" * 60 + "9"]
    assert long[0] not in cache._kept  # longer than max_entry
    batch = _entries(SID_A, 10, 4)
    for _ in range(2):
        assert len(read(cache, batch, SID_A)) == 4
    assert not set(batch) & set(cache._kept)  # a read larger than the cache: not kept
    for n in range(100):
        read(cache, _entries(f"{n:032x}", 0, 1), f"{n:032x}")
    assert len(cache._last_read) <= 3 + 1


def test_a_kept_entry_of_another_session_is_refused() -> None:
    cache = EntryCache(size=10, max_entry=100)
    a = _entries(SID_A, 0, 2)
    for _ in range(2):
        read(cache, a, SID_A)
    assert list(cache._kept) == a
    for _ in range(2):  # the first read decodes, the next looks up: both check
        with pytest.raises(CorruptRecord):
            read(cache, a, SID_B)
