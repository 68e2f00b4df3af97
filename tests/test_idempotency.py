"""A repeated idempotency key stores nothing new and returns the first receipt."""

from __future__ import annotations

from typing import Any

import pytest

from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

A = avatar(1)


def test_repeat_returns_first_receipt_and_stores_nothing(store: ConversationStore) -> None:
    first = store.record(
        A, "public", AvatarMessage(text="hello"), idempotency_key="1700000000000-0"
    )
    other = store.record(A, "public", AvatarMessage(text="next"), idempotency_key="1700000000000-1")
    # When the first message is redelivered (even with different words)
    again = store.record(
        A, "public", AvatarMessage(text="changed"), idempotency_key="1700000000000-0"
    )
    # Then the first receipt comes back and nothing new is stored
    assert again == first
    assert other.seq > first.seq
    assert [t.text for t in store.read_page(A, "public").turns] == ["hello", "next"]
    meta = store.list_metadata().items[0]
    assert meta.turn_count == 2


def test_repeat_keeps_truncation_flag(make_store: Any) -> None:
    store: ConversationStore = make_store(ConversationConfig(limits=Limits(max_text_bytes=64)))
    first = store.record(A, "im", AvatarMessage(text="x" * 100), idempotency_key="k")
    again = store.record(A, "im", AvatarMessage(text="short"), idempotency_key="k")
    assert first.truncated and again == first


def test_keys_are_per_session(store: ConversationStore) -> None:
    a = store.record(A, "public", AvatarMessage(text="pub"), idempotency_key="same")
    b = store.record(A, "im", AvatarMessage(text="im"), idempotency_key="same")
    c = store.record(avatar(2), "public", AvatarMessage(text="other"), idempotency_key="same")
    assert len({a.seq, b.seq, c.seq}) == 3


def test_without_key_every_call_is_a_turn(store: ConversationStore) -> None:
    for _ in range(3):
        store.record(A, "public", AvatarMessage(text="same words"))
    assert len(store.read_page(A, "public").turns) == 3
