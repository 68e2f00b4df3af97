"""The store's operations that need no Lua, tested directly: every reply and every refusal.

A single command is a plain command (CONVENTIONS): reading a shard's events and
the restored marker are one command each, a shard's published limits are
replaced whole (DEL + HSET in one MULTI/EXEC) and its stats read together (one
MULTI/EXEC read), through both executors. With no script to check their
arguments, each call's builder checks what the script did, before there is any
command to send. The stream calls of the same kind are in test_service_scripts.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_py

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem.errors import BadScriptArgument
from gridmem.keys import KeySpace
from gridmem.scripts import Scripts
from gridmem.scripts import StatsReply
from tests.helpers import avatar

pytestmark = pytest.mark.both_doors  # every store test, through both doors

SCRIPTS = Scripts()
SHARD = KeySpace().shard(0)
A, B = avatar(1), avatar(2)


@pytest.fixture
def run(store: ConversationStore) -> Any:
    return store.executor.call


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_read_events_reads_a_shard_oldest_first_after_an_id(
    run: Any, store: ConversationStore
) -> None:
    assert run(SCRIPTS.read_events(SHARD, after="", count=10)) == []
    # Given three events: two deletions and an expiry
    for who in (A, B):
        store.record(who, "public", AvatarMessage(text="hi"))
    store.delete(A, "public")
    store.expire(B, "public")
    store.record(A, "im", AvatarMessage(text="again"))
    store.delete(A, "im")
    # Then they come oldest first, each with its reason and counts, never content
    events = run(SCRIPTS.read_events(SHARD, after="", count=10))
    assert [(f["reason"], f["uuid"], f["ch"]) for _, f in events] == [
        ("deleted_operator", A, "public"),
        ("expired_operator", B, "public"),
        ("deleted_operator", A, "im"),
    ]
    assert set(events[0][1]) == {"reason", "at", "sid", "uuid", "ch", "turns", "bytes"}
    # And `after` an event ID reads on from there (exclusive), `count` at most
    (first, _), (second, _), (third, _) = events
    assert [i for i, _ in run(SCRIPTS.read_events(SHARD, after=first, count=10))] == [
        second,
        third,
    ]
    assert [i for i, _ in run(SCRIPTS.read_events(SHARD, after=first, count=1))] == [second]
    assert run(SCRIPTS.read_events(SHARD, after=third, count=10)) == []


def test_mark_restored_reads_and_sets_the_marker(run: Any, redis: redis_py.Redis) -> None:
    assert run(SCRIPTS.mark_restored(SHARD, generation=None)) == ""
    assert run(SCRIPTS.mark_restored(SHARD, generation=4)) == ""  # the value before
    assert run(SCRIPTS.mark_restored(SHARD, generation=None)) == "4"
    assert run(SCRIPTS.mark_restored(SHARD, generation=0)) == "4"
    assert _text(redis.get(SHARD.restored)) == "0"


def test_publish_limits_replaces_the_hash_whole(run: Any, redis: redis_py.Redis) -> None:
    assert run(SCRIPTS.publish_limits(SHARD, {"max_events": 5, "key_meta": "gm:{0}:<uuid>"})) == 2
    assert run(SCRIPTS.publish_limits(SHARD, {"max_turns": 7})) == 1
    assert {_text(k): _text(v) for k, v in redis.hgetall(SHARD.limits).items()} == {
        "max_turns": "7"
    }


def test_read_stats_reads_a_shard_whole(
    run: Any, store: ConversationStore, redis: redis_py.Redis
) -> None:
    assert run(SCRIPTS.read_stats(SHARD)) == StatsReply(0, 0, {}, {})
    # Given two public sessions and one IM session, and the limits the store published
    for who, channel in ((A, "public"), (B, "public"), (A, "im")):
        store.record(who, channel, AvatarMessage(text="my token: sk-ant-api03-" + "x" * 40))
    stats = run(SCRIPTS.read_stats(SHARD))
    # Then: sessions per channel, the stats hash and the limits hash, as strings
    assert (stats.public, stats.im) == (2, 1)
    assert stats.stats["redactions"] == "3"
    assert int(stats.stats["bytes"]) == sum(
        int(redis.hget(f"gm:{{0}}:s:{who}:{ch}:meta", "bytes") or 0)
        for who, ch in ((A, "public"), (B, "public"), (A, "im"))
    )
    assert stats.limits["max_events"] == str(store.config.limits.max_events)
    assert stats.limits["key_events"] == SHARD.events


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SCRIPTS.read_events(SHARD, after="abc", count=5), "after"),
        (lambda: SCRIPTS.read_events(SHARD, after="1-", count=5), "after"),
        (lambda: SCRIPTS.read_events(SHARD, after="", count=0), "count"),
        (lambda: SCRIPTS.read_events(SHARD, after="", count=10_001), "count"),
        (lambda: SCRIPTS.read_events(SHARD, after="", count="5"), "count"),
        (lambda: SCRIPTS.mark_restored(SHARD, generation=-1), "generation"),
        (lambda: SCRIPTS.mark_restored(SHARD, generation="four"), "generation"),
        (lambda: SCRIPTS.mark_restored(SHARD, generation=True), "generation"),
        (lambda: SCRIPTS.publish_limits(SHARD, {}), "limits"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"Max": 1}), "limit"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"max events": 1}), "limit"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"max_events": -1}), "max_events"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"max_events": "5"}), "max_events"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"key_meta": "gm:{0}: meta"}), "key_meta"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"key_meta": ""}), "key_meta"),
        (lambda: SCRIPTS.publish_limits(SHARD, {"key_meta": 5}), "key_meta"),
    ],
)
def test_bad_arguments_are_refused_before_any_command(build: Callable[[], Any], field: str) -> None:
    """What the scripts checked, the builders check: the refusal names the field, as
    a script's GM_BADARG did, and leaves no call to send."""
    with pytest.raises(BadScriptArgument, match=f"^GM_BADARG {field}$"):
        build()
