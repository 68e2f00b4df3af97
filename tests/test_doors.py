"""The two doors of the store: the same public API, blocking and asyncio.

The behavioural suite runs through both (tests/doors.py, `pytest.mark.both_doors`);
this file pins what the suite cannot see: that the async door is exported and has
every public method of the blocking one, with the same parameters.
"""

from __future__ import annotations

import inspect
from types import FunctionType

import gridmem
from gridmem import AsyncConversationStore
from gridmem import ConversationStore

# Only how each I/O style closes differs: asyncio closes with `aclose`.
SYNC_ONLY = {"close"}
ASYNC_ONLY = {"aclose"}
# On both doors, but no coroutine: from_config connects (and may start a server) at start-up.
CONSTRUCTORS = {"from_config"}


def public(cls: type) -> dict[str, object]:
    """The public methods a class defines (attributes and properties aside)."""
    return {
        name: value
        for name, value in vars(cls).items()
        if not name.startswith("_") and isinstance(value, FunctionType | classmethod)
    }


def test_the_async_door_is_exported() -> None:
    assert "AsyncConversationStore" in gridmem.__all__
    assert gridmem.AsyncConversationStore is AsyncConversationStore


def test_the_async_door_has_every_public_method_of_the_blocking_one() -> None:
    sync, door = public(ConversationStore), public(AsyncConversationStore)
    assert set(sync) - SYNC_ONLY <= set(door), "missing on the async door"
    assert set(door) - set(sync) == ASYNC_ONLY
    for name in CONSTRUCTORS:
        assert isinstance(sync[name], classmethod) and isinstance(door[name], classmethod), name
    for name in set(sync) - SYNC_ONLY - CONSTRUCTORS:
        blocking, coroutine = sync[name], door[name]
        assert inspect.iscoroutinefunction(coroutine), name
        assert inspect.signature(coroutine) == inspect.signature(blocking), name
