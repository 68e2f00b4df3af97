"""Several OS processes writing at once through a real server: one total order, nothing lost."""

from __future__ import annotations

import itertools
import multiprocessing as mp
from typing import Any

import pytest
import redis as redis_py

from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import TurnView
from gridmem.embedded import EmbeddedValkey
from tests.conftest import REAL_ENGINES
from tests.helpers import avatar

PROCESSES = 4
TURNS = 150
SHARED = avatar(0)
# Room for every turn of the shared key, so none is folded into the summary.
CONFIG = ConversationConfig(limits=Limits(max_turns_per_session=PROCESSES * TURNS))

pytestmark = pytest.mark.real


def _writer(socket_path: str, number: int, barrier: Any) -> None:
    # Each process builds its own client after it starts: no pool crosses a fork.
    store = ConversationStore(redis_py.Redis(unix_socket_path=socket_path), CONFIG)
    own = avatar(number + 1)
    barrier.wait(timeout=30)
    for i in range(TURNS):
        store.record(SHARED, "public", AvatarMessage(text=f"p{number}-{i}"))
        store.record(own, "im", AvatarMessage(text=f"own{number}-{i}"))


def _read_all(store: ConversationStore, uuid: str, channel: str) -> list[TurnView]:
    turns: list[TurnView] = []
    anchor = None
    while True:
        page = store.read_page(uuid, channel, anchor=anchor, direction="forward", limit=200)
        turns.extend(page.turns)
        if not page.has_more:
            return turns
        anchor = page.next_anchor


@pytest.mark.parametrize("engine", list(REAL_ENGINES))
def test_four_processes_one_total_order(
    real_servers: dict[str, EmbeddedValkey], engine: str
) -> None:
    server = real_servers[engine]
    server.client().flushall()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [
        ctx.Process(target=_writer, args=(str(server.socket_path), n, barrier))
        for n in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0

    store = ConversationStore(server.client(), CONFIG)
    shared = _read_all(store, SHARED, "public")
    owns = [_read_all(store, avatar(n + 1), "im") for n in range(PROCESSES)]
    all_seqs = [t.seq for t in shared] + [t.seq for own in owns for t in own]
    # Every sequence unique across the store, and nothing lost
    assert len(all_seqs) == len(set(all_seqs)) == 2 * PROCESSES * TURNS
    assert [t.seq for t in shared] == sorted(t.seq for t in shared)
    # Each process's turns appear in its own submission order, in the shared key and its own
    for n in range(PROCESSES):
        mine = [int(t.text.split("-")[1]) for t in shared if t.text.startswith(f"p{n}-")]
        assert mine == list(range(TURNS))
        assert [t.text for t in owns[n]] == [f"own{n}-{i}" for i in range(TURNS)]
    # The writers really overlapped: the shared key interleaves processes
    writers = [t.text.split("-")[0] for t in shared]
    switches = sum(1 for a, b in itertools.pairwise(writers) if a != b)
    assert switches > PROCESSES
