"""A client connection cut mid-call on the real cluster (issue 15): retried only where
the call is idempotent, and never a turn stored twice.

Every node connection of the store's cluster client goes through a small TCP proxy
(redis-py's `address_remap`), which can cut one connection at either point that
matters: before the request reaches the server (it ran nothing) or after the
server has answered (it ran the call, the reply is lost: the case where a resend
could store a turn twice). What the server holds is read from the node itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py

from gridmem import AsyncConversationStore
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import connect_cluster
from gridmem import connect_cluster_async
from gridmem.embedded import EmbeddedCluster
from gridmem.keys import KeySpace
from tests.conftest import flush_cluster
from tests.helpers import avatar
from tests.test_cluster import node_of_slot
from tests.test_cluster import on_node
from tests.test_shard_tags import slot

pytestmark = pytest.mark.real

SHARDS = 6
CONFIG = ConversationConfig(shards=SHARDS)
WHO = avatar(11)


class CuttingProxy:
    """Forwards TCP connections to one node. `cut("request")` drops the next bytes a
    client sends and closes that connection (the server never sees them);
    `cut("reply")` lets them through and drops the server's answer instead, closing
    the connection (the server ran the call; the client never hears of it)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = ""  # "", "request" or "reply"
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, where: str) -> None:
        with self.lock:
            self.armed = where

    def _take(self, where: str) -> bool:
        with self.lock:
            if self.armed != where:
                return False
            self.armed, self.cuts = "", self.cuts + 1
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self.target))
            for source, sink, where in ((client, server, "request"), (server, client, "reply")):
                threading.Thread(
                    target=self._pump, args=(source, sink, where, (client, server)), daemon=True
                ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, where: str, pair: tuple[Any, Any]
    ) -> None:
        with contextlib.suppress(OSError):  # either end closed: close the other
            while data := source.recv(65536):
                if self._take(where):
                    break  # dropped: the connection is cut below
                sink.sendall(data)
        for end in pair:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxies(real_cluster: EmbeddedCluster) -> Iterator[dict[int, CuttingProxy]]:
    flush_cluster(real_cluster)
    found = {port: CuttingProxy(port) for port in real_cluster.ports}
    yield found
    for proxy in found.values():
        proxy.close()


def remap(proxies: dict[int, CuttingProxy]) -> Any:
    def through_proxy(address: tuple[str, int]) -> tuple[str, int]:
        host, port = address
        return ("127.0.0.1", proxies[port].port) if port in proxies else (host, port)

    return through_proxy


def turns_stored(cluster: EmbeddedCluster) -> list[str]:
    """WHO's IM transcript as its primary holds it (member texts, in order)."""
    turns = KeySpace("gm", SHARDS).session(WHO, Channel.IM)[0].turns
    owner = node_of_slot(cluster)[slot(turns)]
    return [m.decode() for m in on_node(cluster, owner, "ZRANGE", turns, 0, -1)]


def texts(stored: list[str]) -> list[str]:
    return [member.rsplit('"', 2)[-2] for member in stored]  # the record's text, last field


def primary_proxy(cluster: EmbeddedCluster, proxies: dict[int, CuttingProxy]) -> CuttingProxy:
    meta = KeySpace("gm", SHARDS).session(WHO, Channel.IM)[0].meta
    return proxies[node_of_slot(cluster)[slot(meta)]]


class SyncDoor:
    """The calls the test makes, through the blocking door."""

    def __init__(self, cluster: EmbeddedCluster, proxies: dict[int, CuttingProxy]) -> None:
        client = connect_cluster(cluster.url, address_remap=remap(proxies))
        self.store = ConversationStore(client, CONFIG, clock=ManualClock())

    def record(self, text: str, key: str | None = None) -> Any:
        return self.store.record(WHO, Channel.IM, AvatarMessage(text=text), idempotency_key=key)

    def context(self) -> list[str]:
        return [m.content for m in self.store.context(WHO, Channel.IM)]

    def close(self) -> None:
        self.store.close()


class AsyncDoor:
    """The same calls through the asyncio door, each run on the door's own loop."""

    def __init__(self, cluster: EmbeddedCluster, proxies: dict[int, CuttingProxy]) -> None:
        self.loop = asyncio.new_event_loop()
        client = connect_cluster_async(cluster.url, address_remap=remap(proxies))
        self.store = AsyncConversationStore(client, CONFIG, clock=ManualClock())

    def record(self, text: str, key: str | None = None) -> Any:
        return self.loop.run_until_complete(
            self.store.record(WHO, Channel.IM, AvatarMessage(text=text), idempotency_key=key)
        )

    def context(self) -> list[str]:
        found = self.loop.run_until_complete(self.store.context(WHO, Channel.IM))
        return [m.content for m in found]

    def close(self) -> None:
        self.loop.run_until_complete(self.store.aclose())
        self.loop.close()


@pytest.mark.parametrize("door_class", [SyncDoor, AsyncDoor], ids=["sync", "async"])
def test_a_cut_connection_is_resent_only_where_idempotent_and_no_turn_doubles(
    real_cluster: EmbeddedCluster, proxies: dict[int, CuttingProxy], door_class: Any
) -> None:
    door = door_class(real_cluster, proxies)
    try:
        door.record("warm up")  # the client knows the slot map and has its connections
        proxy = primary_proxy(real_cluster, proxies)
        # Given the reply to a record with an idempotency key is lost (the server ran it)
        proxy.cut("reply")
        receipt = door.record("with key", "entry-1")
        # Then it was resent and answered as the repeat it is: stored once
        assert proxy.cuts == 1
        assert receipt.duplicate
        assert texts(turns_stored(real_cluster)) == ["warm up", "with key"]
        # Given the reply to a record without a key is lost
        proxy.cut("reply")
        with pytest.raises(redis_py.ConnectionError):
            door.record("no key, ran")  # a resend could store it twice: the caller decides
        assert proxy.cuts == 2
        assert texts(turns_stored(real_cluster)) == ["warm up", "with key", "no key, ran"]
        # Given a record without a key never reaches the server
        proxy.cut("request")
        with pytest.raises(redis_py.ConnectionError):
            door.record("no key, lost")
        assert proxy.cuts == 3
        assert texts(turns_stored(real_cluster)) == ["warm up", "with key", "no key, ran"]
        # and a read whose reply is lost is simply read again
        proxy.cut("reply")
        assert door.context() == ["warm up", "with key", "no key, ran"]
        assert proxy.cuts == 4
        # and the same key once more, after all that, still stores nothing
        assert door.record("with key", "entry-1").duplicate
        assert len(turns_stored(real_cluster)) == 3
    finally:
        door.close()
