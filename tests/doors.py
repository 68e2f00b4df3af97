"""Both doors of the store through one behavioural suite.

A module marked `pytest.mark.both_doors` runs each test that uses the `store` or
`make_store` fixture twice: through ConversationStore, and through
AsyncConversationStore behind `BlockingDoor`, a thin blocking adapter. The
adapter runs each coroutine to completion on its own event loop in the test's
thread, over a `redis.asyncio` client of the same server (for fakeredis, an
async FakeRedis on the same FakeServer), so a test reads the same whichever
door it was handed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any
from typing import cast

import fakeredis
import redis as redis_py
import redis.asyncio as redis_async

from gridmem import AsyncConversationStore
from gridmem import ConversationConfig
from gridmem import ManualClock
from gridmem.store import connect_async
from gridmem.store import connect_cluster_async

DOORS = ["sync", "async"]


class Blocking:
    """An object's coroutine methods as blocking calls on `loop`; other attributes as they are."""

    def __init__(self, wrapped: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.door = wrapped
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.door, name)
        if not inspect.iscoroutinefunction(value):
            return value

        @functools.wraps(value)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(value(*args, **kwargs))

        return blocking


class BlockingDoor(Blocking):
    """AsyncConversationStore behind blocking calls; nothing of the store's own.

    Coroutine methods block until done, its executor's too; every other attribute
    (config, clock, snapshots, scripts, _ops) is the async store's. `redis` is the
    test's blocking client of the same server, for tests that look at keys directly.
    """

    def __init__(
        self,
        store: AsyncConversationStore,
        redis_client: redis_py.Redis,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(store, loop)
        self.redis = redis_client
        self.executor = Blocking(store.executor, loop)

    def close(self) -> None:
        self._loop.run_until_complete(self.door.aclose())


class AsyncDoors:
    """Builds BlockingDoors for one test, on one event loop; `close` ends them all."""

    def __init__(
        self,
        redis_client: redis_py.Redis,
        url: str | None,
        clock: ManualClock,
        *,
        cluster: bool = False,
    ) -> None:
        self.redis = redis_client
        self.url = url  # None: fakeredis
        self.cluster = cluster  # url names a node of a cluster
        self.clock = clock
        self.loop = asyncio.new_event_loop()
        self.clients: list[redis_async.Redis] = []
        self.counters: list[Any] = []

    def watch(self, counter: Any) -> None:
        """Count the commands of every async client, made so far or later (CommandCounter)."""
        self.counters.append(counter)
        for client in self.clients:
            counter.watch_async(client)

    def make(self, config: ConversationConfig | None = None, **kwargs: Any) -> BlockingDoor:
        client = self._async_twin()
        self.clients.append(client)
        for counter in self.counters:
            counter.watch_async(client)
        store = AsyncConversationStore(
            client, config or ConversationConfig(), clock=self.clock, **kwargs
        )
        return BlockingDoor(store, self.redis, self.loop)

    def _async_twin(self) -> redis_async.Redis:
        """An asyncio client of the server the blocking client talks to."""
        if self.url is not None and self.cluster:
            return cast(redis_async.Redis, connect_cluster_async(self.url))
        if self.url is not None:
            return connect_async(self.url)
        server = self.redis.connection_pool.connection_kwargs["server"]
        return fakeredis.FakeAsyncRedis(server=server)

    def close(self) -> None:
        for client in self.clients:
            self.loop.run_until_complete(client.aclose())
        self.loop.close()
