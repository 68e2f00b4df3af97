"""read_page: chronological pages for operators, anchored on sequence numbers."""

from __future__ import annotations

from typing import Any

import pytest

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ToolSummary
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

A = avatar(1)


@pytest.fixture
def filled(store: ConversationStore) -> list[int]:
    seqs = []
    for i in range(23):
        seqs.append(store.record(A, "public", AvatarMessage(text=f"m{i}")).seq)
        store.record(avatar(2), "public", AvatarMessage(text="noise"))  # interleaved sequences
    return seqs


def test_backward_pages_cover_everything_once(store: ConversationStore, filled: list[int]) -> None:
    texts: list[str] = []
    anchor = None
    while True:
        page = store.read_page(A, "public", anchor=anchor, limit=5)
        assert [t.seq for t in page.turns] == sorted(t.seq for t in page.turns)
        texts = [t.text for t in page.turns] + texts
        if not page.has_more:
            break
        anchor = page.next_anchor
    assert texts == [f"m{i}" for i in range(23)]


def test_forward_pages_cover_everything_once(store: ConversationStore, filled: list[int]) -> None:
    seqs: list[int] = []
    anchor = None
    while True:
        page = store.read_page(A, "public", anchor=anchor, direction="forward", limit=4)
        seqs.extend(t.seq for t in page.turns)
        if not page.has_more:
            break
        anchor = page.next_anchor
    assert seqs == filled


def test_page_edges(store: ConversationStore, filled: list[int]) -> None:
    newest = store.read_page(A, "public", limit=3)
    assert [t.text for t in newest.turns] == ["m20", "m21", "m22"]
    assert newest.has_more and newest.next_anchor == filled[20]
    exact = store.read_page(A, "public", anchor=filled[3], limit=3)
    assert [t.text for t in exact.turns] == ["m0", "m1", "m2"] and not exact.has_more
    after_end = store.read_page(A, "public", anchor=filled[-1], direction="forward")
    assert after_end.turns == [] and not after_end.has_more and after_end.next_anchor is None


@pytest.mark.parametrize(("asked", "got"), [(0, 1), (-3, 1), (1, 1), (200, 23), (201, 23)])
def test_limit_is_clamped(
    store: ConversationStore, filled: list[int], asked: int, got: int
) -> None:
    assert len(store.read_page(A, "public", limit=asked).turns) == got


def test_clamped_to_200(make_store: Any) -> None:
    store: ConversationStore = make_store(
        ConversationConfig(limits=Limits(max_turns_per_session=300))
    )
    for i in range(205):
        store.record(A, "im", AvatarMessage(text=f"t{i}"))
    assert len(store.read_page(A, "im", limit=201).turns) == 200


def test_turn_view_shapes(store: ConversationStore, clock: object) -> None:
    store.record(A, "im", AvatarMessage(text="hi"))
    store.record(A, "im", AgentReply(text="hello"))
    store.record(A, "im", ToolSummary(tool="map", summary="3 regions"))
    store.record(A, "im", ActionResult(action="give", status="failed", detail="no perms"))
    turns = store.read_page(A, "im").turns
    assert [(t.kind, t.role, t.text, t.untrusted) for t in turns] == [
        ("avatar_message", "avatar", "hi", True),
        ("agent_reply", "agent", "hello", False),
        ("tool_summary", "tool", "3 regions", True),
        ("action_result", "agent", "give failed: no perms", False),
    ]


def test_missing_session_is_an_empty_page(store: ConversationStore) -> None:
    page = store.read_page(A, "public")
    assert page.turns == [] and not page.has_more and page.next_anchor is None
