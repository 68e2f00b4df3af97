"""What a store publishes for bin/gridmem-cli: its layout and the bounds it applies.

Issue 12 item 8: the CLI trimmed the event stream to a hard-coded 10,000 and read
shard 0 only, because it re-encoded what the store knows. Now the store
publishes every shard's key prefix (the hash `<namespace>:layout`) and each shard's limits and bounds, before its first
write; the CLI reads them (tests/test_operator_cli.py runs it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest
import redis as redis_py

from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem.errors import BadScriptArgument
from gridmem.executor import translate
from gridmem.keys import KeySpace
from gridmem.keys import shard_tags
from gridmem.scripts import Scripts
from gridmem.scripts import load_scripts
from tests.conftest import CommandCounter
from tests.helpers import avatar

pytestmark = pytest.mark.both_doors  # every store test, through both doors

SCRIPTS = load_scripts()
MINUTE_MS = 60_000  # docs/operations.md: a writing store publishes again each minute


def _decoded(mapping: dict[Any, Any]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in mapping.items()}


def _sessions_by_prefix(redis: redis_py.Redis, prefixes: list[str]) -> dict[str, list[str]]:
    """Which avatars live under which published prefix, read from the keys themselves."""
    found: dict[str, list[str]] = defaultdict(list)
    for raw in redis.keys("*:meta"):
        key = raw.decode()
        [prefix] = [p for p in prefixes if key.startswith(p)]
        found[prefix].append(key[len(prefix) + 2 :].split(":")[0])
    return found


@pytest.mark.parametrize("shards", [1, 3])
def test_first_write_publishes_layout_and_limits(make_store: Any, redis: Any, shards: int) -> None:
    # Given a store with a namespace of its own and limits of its own
    limits = Limits(max_events=4, max_turns_per_session=7)
    store = make_store(ConversationConfig(namespace="pub", shards=shards, limits=limits))
    assert not redis.exists("pub:layout")  # nothing before the first write
    # When it records for the first time
    store.record(avatar(1), "im", AvatarMessage(text="hi"))
    # Then the layout names its shards' prefixes: distinct, of this namespace, one hash tag
    prefixes = _decoded(redis.hgetall("pub:layout"))["pub"].split(" ")
    assert len(prefixes) == shards == len(set(prefixes))
    assert all(re.fullmatch(r"pub:\{[^{}\s]+\}:", p) for p in prefixes)
    # and every shard's limits hash holds the configured limits and its place
    for n, prefix in enumerate(prefixes):
        published = _decoded(redis.hgetall(prefix + "limits"))
        assert published["max_events"] == "4" and published["max_turns_per_session"] == "7"
        assert published["max_active_sessions"] == str(limits.max_active_sessions)
        assert published["shards"] == str(shards) and published["shard"] == str(n)
        assert {"events_maxlen", "page_limit_max", "metadata_limit_max", "events_count_max"} <= set(
            published
        )
    # and the session it wrote lives under one of the published prefixes
    assert sum(len(v) for v in _sessions_by_prefix(redis, prefixes).values()) == 1


def test_published_events_maxlen_is_the_bound_the_streams_keep(make_store: Any, redis: Any) -> None:
    """The CLI trims with events_maxlen: it must be what the store's own deletes trim to."""
    # max_events = 14 over 3 shards: each stream keeps its share, 4 (the remainder is dropped)
    store = make_store(ConversationConfig(namespace="pub", shards=3, limits=Limits(max_events=14)))
    people = [avatar(n) for n in range(40)]
    for who in people:
        store.record(who, "im", AvatarMessage(text="hi"))
    prefixes = _decoded(redis.hgetall("pub:layout"))["pub"].split(" ")
    by_prefix = _sessions_by_prefix(redis, prefixes)
    for prefix in prefixes:
        assert len(by_prefix[prefix]) >= 6  # enough deletes in every shard to pass the bound
        for who in by_prefix[prefix][:6]:
            assert store.delete(who, "im")
        published = int(redis.hget(prefix + "limits", "events_maxlen"))
        assert redis.xlen(prefix + "events") == published == 4


def test_published_once_per_store(
    make_store: Any, redis: Any, command_counter: CommandCounter, door: str
) -> None:
    store: ConversationStore = make_store(ConversationConfig(shards=3))
    store.record(avatar(1), "im", AvatarMessage(text="first"))
    first = [c for c in command_counter.commands if c != "<connection>"]
    # the layout and the record (plus one FCALL that found no library), and 3 shards'
    # limits, each one MULTI/EXEC: a connection taken without a command through execute_command
    assert first.count("FCALL") - first.count("FUNCTION") == 1 + 1
    # every command takes a connection of its own, but the async executor sends the
    # library's load and the FCALL again on the connection of the FCALL that found none
    shared = 2 if door == "async" else 0
    assert command_counter.commands.count("<connection>") + shared - len(first) == 3
    command_counter.commands.clear()
    store.record(avatar(2), "im", AvatarMessage(text="second"))
    assert [c for c in command_counter.commands if c != "<connection>"] == ["FCALL"]
    assert command_counter.commands.count("<connection>") == 1


def test_a_writing_store_publishes_again_after_the_server_lost_it(
    make_store: Any, redis: Any, clock: ManualClock
) -> None:
    """A server restarted or flushed behind the store's back shows the layout again."""
    store = make_store(ConversationConfig(namespace="pub"))
    store.record(avatar(1), "im", AvatarMessage(text="hi"))
    redis.flushall()
    clock.advance(MINUTE_MS - 1)
    store.record(avatar(1), "im", AvatarMessage(text="still within the minute"))
    assert not redis.exists("pub:layout")
    clock.advance(1)
    store.record(avatar(1), "im", AvatarMessage(text="a minute on"))
    assert _decoded(redis.hgetall("pub:layout")) == {"pub": "pub:{0}:"}
    assert redis.hget("pub:{0}:limits", "events_maxlen") == str(Limits().max_events).encode()


def test_two_stores_on_one_server_each_publish_their_own_layout(
    make_store: Any, redis: Any
) -> None:
    make_store(ConversationConfig(namespace="one")).record(avatar(1), "im", AvatarMessage(text="a"))
    make_store(ConversationConfig(namespace="two", shards=2)).record(
        avatar(1), "im", AvatarMessage(text="b")
    )
    assert _decoded(redis.hgetall("one:layout")) == {"one": "one:{0}:"}
    two = " ".join(f"two:{{{tag}}}:" for tag in shard_tags(2))  # the tags of 2 shards
    assert two.startswith("two:{0-1}: two:{1}:")  # as docs/scaling.md's rule finds them
    assert _decoded(redis.hgetall("two:layout")) == {"two": two}


# -- publish_layout.lua directly ---------------------------------------------------------


def _publish(redis: redis_py.Redis, *args: str) -> Any:
    try:
        key = f"{args[0]}:layout" if args else ":layout"
        return redis.eval(SCRIPTS["publish_layout"].source, 1, key, *args)
    except redis_py.ResponseError as exc:
        raise translate(exc) from None


def test_publish_layout_returns_the_shard_count_and_replaces_its_entry(redis: Any) -> None:
    assert _publish(redis, "gm", "gm:{0}:", "gm:{1}:") == 2
    assert _publish(redis, "other", "other:{a}:") == 1
    assert _publish(redis, "gm", "gm:{7}:") == 1
    assert _decoded(redis.hgetall("gm:layout")) == {"gm": "gm:{7}:"}
    assert _decoded(redis.hgetall("other:layout")) == {"other": "other:{a}:"}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["gm"], "prefixes"),
        (["GM", "GM:{0}:"], "namespace"),
        (["n" * 33, "n" * 33 + ":{0}:"], "namespace"),
        (["gm", "other:{0}:"], "prefix"),  # a prefix of another store
        (["gm", "gm:0:"], "prefix"),  # no hash tag
        (["gm", "gm:{0} gm:{1}:"], "prefix"),  # would split into two
        (["gm", "gm:{0}:", ""], "prefix"),
    ],
)
def test_publish_layout_refuses_malformed_arguments(
    redis: Any, args: list[str], field: str
) -> None:
    with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}$"):
        _publish(redis, *args)
    assert redis.keys("*") == []


@pytest.mark.parametrize(
    "key", ["other:layout", "gm:layouts", "gridmem:namespaces", "gm:{0}:layout"]
)
def test_publish_layout_writes_only_its_namespace_layout(redis: Any, key: str) -> None:
    """Every key lives inside its namespace (DESIGN section 3), so an ACL of `~gm:*` covers it."""
    with pytest.raises(BadScriptArgument, match=r"GM_BADARG key$"):
        try:
            redis.eval(SCRIPTS["publish_layout"].source, 1, key, "gm", "gm:{0}:")
        except redis_py.ResponseError as exc:
            raise translate(exc) from None
    assert redis.keys("*") == []


def test_every_shard_publishes_its_key_names_as_templates(make_store: Any, redis: Any) -> None:
    """bin/gridmem-cli builds no key name: each shard's limits hash carries them."""
    from gridmem.keys import KeySpace

    store = make_store(ConversationConfig(namespace="pub", shards=3))
    store.record(avatar(1), "im", AvatarMessage(text="hi"))
    space = KeySpace("pub", 3)
    shard = space.shard_of(avatar(1))
    for n in range(3):
        published = _decoded(redis.hgetall(space.shard(n).limits))
        templates = {k: v for k, v in published.items() if k.startswith("key_")}
        assert templates == space.templates(n)
        assert templates["key_sessions"] == f"pub:{{{shard_tags(3)[n]}}}:sessions"
    # filled in, they name the keys the store wrote
    published = _decoded(redis.hgetall(space.shard(shard).limits))
    filled = published["key_meta"].replace("<uuid>", avatar(1)).replace("<channel>", "im")
    assert redis.exists(filled) and redis.exists(published["key_lru_im"])
    assert published["key_member"].replace("<uuid>", "u").replace("<channel>", "im") == "u:im"


def test_publish_limits_refuses_a_key_name_with_a_space() -> None:
    with pytest.raises(BadScriptArgument, match=r"GM_BADARG key_meta$"):
        Scripts().publish_limits(KeySpace().shard(0), {"key_meta": "gm:{0}: meta"})
