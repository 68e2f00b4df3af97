"""A test kit for your own agent's tests: gridmem on fakeredis, with time paused.

Needs the `testing` extra (`pip install 'gridmem[testing]'`: fakeredis with Lua,
and pytest for the fixtures); the core install never imports this module.

    from gridmem.testing import fake_store, advance_past_ttl, fill_session

    store, clock = fake_store()             # the real Lua functions, in-process
    store.record(uuid, "public", AvatarMessage(text="hi"))
    advance_past_ttl(clock, "public")       # the next turn starts a new session

Or as pytest fixtures, enabled with one line in your conftest.py:

    pytest_plugins = ["gridmem.testing"]

    def test_my_agent(gridmem_store, gridmem_clock): ...

fakeredis runs the same Lua functions a real server runs (CONVENTIONS: our fake is
not a re-implementation), so bounds, redaction, expiry and compaction behave as
in production. The clock is a paused ManualClock: nothing expires unless the test
moves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

try:
    import fakeredis
    import pytest
except ImportError as missing:  # pragma: no cover - only without the extra
    raise ImportError(
        f"gridmem.testing needs the testing extra: pip install 'gridmem[testing]' ({missing})"
    ) from None

from gridmem.clock import ManualClock
from gridmem.config import ConversationConfig
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import AvatarMessage
from gridmem.records import Receipt
from gridmem.store import AsyncConversationStore
from gridmem.store import ConversationStore
from gridmem.validate import canonical_uuid
from gridmem.validate import parse_channel

__all__ = [
    "advance_past_ttl",
    "fake_async_store",
    "fake_store",
    "fill_session",
    "gridmem_async_store",
    "gridmem_clock",
    "gridmem_config",
    "gridmem_store",
    "ttl_ms",
]


def fake_store(
    config: ConversationConfig | None = None,
    *,
    clock: ManualClock | None = None,
    server: fakeredis.FakeServer | None = None,
) -> tuple[ConversationStore, ManualClock]:
    """A ConversationStore on a fresh in-process fakeredis server, and its paused clock.

    Pass `server` to share one server between stores (two agents, or a sync and
    an async door); pass `clock` to share one clock."""
    clock = clock or ManualClock()
    client = fakeredis.FakeRedis(server=server or fakeredis.FakeServer())
    return ConversationStore(client, config, clock=clock), clock


def fake_async_store(
    config: ConversationConfig | None = None,
    *,
    clock: ManualClock | None = None,
    server: fakeredis.FakeServer | None = None,
) -> tuple[AsyncConversationStore, ManualClock]:
    """As fake_store, an AsyncConversationStore (close it with `await store.aclose()`)."""
    clock = clock or ManualClock()
    client = fakeredis.FakeAsyncRedis(server=server or fakeredis.FakeServer())
    return AsyncConversationStore(client, config, clock=clock), clock


def ttl_ms(channel: str) -> int:
    """The inactivity TTL of `channel` in ms (public 30 min, IM 24 h)."""
    return CHANNEL_TTL_MS[parse_channel(channel)]


def advance_past_ttl(clock: ManualClock, channel: str) -> None:
    """Move `clock` exactly one TTL of `channel` forward: a session whose last turn
    was recorded before the call is expired (expiry is at now - last >= TTL)."""
    clock.advance(ttl_ms(channel))


def fill_session(
    store: ConversationStore,
    avatar_uuid: str,
    channel: str,
    text: str = "filler turn {i}",
) -> list[Receipt]:
    """Record avatar messages until the session holds `max_turns_per_session` turns,
    its turn bound: the next turn compacts its oldest turns into the summary. `{i}` in
    `text` becomes the turn's index (any other braces are kept as written). Counts the
    turns the session already has. A byte bound (max_session_bytes) that these turns
    exceed compacts the session sooner: then it holds fewer (check turn_count)."""
    bound = store.config.limits.max_turns_per_session
    have = _turn_count(store, canonical_uuid(avatar_uuid), parse_channel(channel))
    return [
        store.record(avatar_uuid, channel, AvatarMessage(text=text.replace("{i}", str(i))))
        for i in range(have, bound)
    ]


def _turn_count(store: ConversationStore, avatar_uuid: str, channel: str) -> int:
    """The session's live turns, from its metadata (a test store holds few sessions)."""
    cursor = None
    while True:
        page = store.list_metadata(cursor, limit=200)
        for item in page.items:
            if item.avatar_uuid == avatar_uuid and item.channel == channel:
                return item.turn_count
        if page.next_cursor is None:
            return 0
        cursor = page.next_cursor


# -- pytest fixtures: `pytest_plugins = ["gridmem.testing"]` in a conftest.py ----------


@pytest.fixture
def gridmem_config() -> ConversationConfig:
    """The configuration of gridmem_store; override this fixture to change limits."""
    return ConversationConfig()


@pytest.fixture
def gridmem_clock() -> ManualClock:
    """The paused clock every gridmem_* store of the test shares."""
    return ManualClock()


@pytest.fixture
def gridmem_server() -> fakeredis.FakeServer:
    """The in-process server every gridmem_* store of the test shares."""
    return fakeredis.FakeServer()


@pytest.fixture
def gridmem_store(
    gridmem_config: ConversationConfig,
    gridmem_clock: ManualClock,
    gridmem_server: fakeredis.FakeServer,
) -> Iterator[ConversationStore]:
    """A ConversationStore on fakeredis with the test's paused clock."""
    store, _ = fake_store(gridmem_config, clock=gridmem_clock, server=gridmem_server)
    yield store
    store.close()


@pytest.fixture
def gridmem_async_store(
    gridmem_config: ConversationConfig,
    gridmem_clock: ManualClock,
    gridmem_server: fakeredis.FakeServer,
) -> Iterator[AsyncConversationStore]:
    """An AsyncConversationStore on the same server and clock as gridmem_store.
    A plain fixture, so it works with any async test runner (or asyncio.run)."""
    store, _ = fake_async_store(gridmem_config, clock=gridmem_clock, server=gridmem_server)
    yield store
    asyncio.run(store.aclose())
