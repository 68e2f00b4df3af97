"""list_metadata pages through every session exactly once, with no content."""

from __future__ import annotations

from typing import Any

import pytest

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import SessionMetadata
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

SECRET_WORDS = "zebra-quartz-marker"


def _walk(store: ConversationStore, limit: int) -> list[SessionMetadata]:
    items: list[SessionMetadata] = []
    cursor = None
    pages = 0
    while True:
        page = store.list_metadata(cursor=cursor, limit=limit)
        items.extend(page.items)
        pages += 1
        assert pages < 1000
        if page.next_cursor is None:
            return items
        cursor = page.next_cursor


def test_pages_through_230_sessions_each_exactly_once(
    store: ConversationStore, clock: ManualClock
) -> None:
    expected = {}
    for n in range(115):
        for channel in Channel:
            r = store.record(avatar(n), channel, AvatarMessage(text=f"{SECRET_WORDS} {n}"))
            expected[(avatar(n), channel)] = r.session_id
        clock.advance(1)
    for limit in (1, 7, 100, 230, 1000):
        items = _walk(store, limit)
        keys = [(m.avatar_uuid, m.channel) for m in items]
        assert len(keys) == len(set(keys)) == 230
        assert {k: m.session_id for k, m in zip(keys, items, strict=True)} == expected
        assert keys == sorted(keys)  # by UUID, then channel


def test_busy_sessions_do_not_move_in_the_walk(
    store: ConversationStore, clock: ManualClock
) -> None:
    for n in range(50):
        store.record(avatar(n), "public", AvatarMessage(text="hi"))
    first = store.list_metadata(limit=20)
    # Sessions on the first page become the most recently active during the walk
    for item in first.items:
        clock.advance(1)
        store.record(item.avatar_uuid, "public", AvatarMessage(text="again"))
    rest = _walk_from(store, first.next_cursor)
    names = [m.avatar_uuid for m in first.items + rest]
    assert len(names) == len(set(names)) == 50


def _walk_from(store: ConversationStore, cursor: str | None) -> list[SessionMetadata]:
    items: list[SessionMetadata] = []
    while cursor is not None:
        page = store.list_metadata(cursor=cursor, limit=20)
        items.extend(page.items)
        cursor = page.next_cursor
    return items


def test_metadata_fields_and_no_content(store: ConversationStore, clock: ManualClock) -> None:
    a = avatar(3)
    created = clock.wall_ms()
    r = store.record(a, "im", AvatarMessage(text=f"{SECRET_WORDS} one"))
    clock.advance(5_000)
    store.record(a, "im", AvatarMessage(text=f"{SECRET_WORDS} two"))
    [meta] = store.list_metadata().items
    assert meta.model_dump().keys() == {
        "session_id", "avatar_uuid", "channel", "created_at_ms",
        "last_active_at_ms", "turn_count", "byte_count",
    }  # fmt: skip
    assert (meta.session_id, meta.avatar_uuid, meta.channel) == (r.session_id, a, Channel.IM)
    assert (meta.created_at_ms, meta.last_active_at_ms) == (created, created + 5_000)
    assert meta.turn_count == 2
    assert meta.byte_count > 2 * len(SECRET_WORDS)
    assert SECRET_WORDS not in meta.model_dump_json()


def test_empty_store(store: ConversationStore) -> None:
    page = store.list_metadata()
    assert page.items == [] and page.next_cursor is None


def test_limit_is_clamped(store: ConversationStore) -> None:
    for n in range(3):
        store.record(avatar(n), "public", AvatarMessage(text="x"))
    assert len(store.list_metadata(limit=0).items) == 1
    assert len(store.list_metadata(limit=-5).items) == 1
    assert len(store.list_metadata(limit=10**9).items) == 3


def test_sharded_store_walks_every_shard(redis: Any, clock: ManualClock) -> None:
    from gridmem import ConversationConfig

    store = ConversationStore(redis, ConversationConfig(shards=4), clock=clock)
    assert len({store._ops.keys.shard_of(avatar(n)) for n in range(40)}) == 4
    for n in range(40):
        store.record(avatar(n), "public", AvatarMessage(text="x"))
    items = _walk(store, 7)
    assert sorted(m.avatar_uuid for m in items) == sorted(avatar(n) for n in range(40))
