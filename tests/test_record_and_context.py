"""The service's two chained calls per message, through the store's doors.

Issue 16 (round trips per answered message): the service stored a resident's
words (one FCALL) and then read the context for the model (one MULTI/EXEC); now
record_and_context sends both in one transaction on the session's slot (a
`Chained` call). What it returns must be what record() then context() return, on
every backend, through both doors, on the cluster too; bad input still reaches
no server. The answer then goes with record_in_session(_then): only into the
session whose context it answers, and chained with the entry's finish.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.errors import InvalidInput
from gridmem.keys import KeySpace
from gridmem.scripts import ScriptCall
from gridmem.scripts import Scripts
from tests.conftest import CommandCounter
from tests.helpers import avatar

pytestmark = [pytest.mark.both_doors, pytest.mark.cluster]  # both doors; the cluster too

PUBLIC_TTL_MS = 1_800_000  # DESIGN section 4

# The conversation both sessions hold before the message under test: the test's own.
EARLIER = [
    AvatarMessage(text="where is the sandbox?"),
    ToolSummary(tool="map", summary="Sandbox: region Ahern, 128,128"),
    AgentReply(text="It's in Ahern."),
]


def _shape(messages: list[Any]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def test_it_returns_what_record_then_context_return(store: ConversationStore) -> None:
    # Given two sessions with the same conversation so far
    fused, apart = avatar(1), avatar(2)
    for record in EARLIER:
        store.record(fused, Channel.IM, record)
        store.record(apart, Channel.IM, record)
    new = AvatarMessage(text="and my password=hunter2, is it safe?")
    # When one gets the next message through record_and_context, the other through
    # record then context
    receipt, context = store.record_and_context(fused, Channel.IM, new, "1700000000000-0")
    expected_receipt = store.record(apart, Channel.IM, new, "1700000000000-0")
    expected = store.context(apart, Channel.IM)
    # Then the receipts and contexts agree (the secret redacted in both)
    assert (receipt.seq, receipt.new_session, receipt.duplicate) == (
        expected_receipt.seq - 1,
        False,
        False,
    )
    assert (receipt.redactions, receipt.truncated) == (1, False)
    assert _shape(context) == _shape(expected)
    assert context[-1].content == "and my password=[REDACTED:secret-assignment], is it safe?"
    assert "hunter2" not in repr(context)


def test_a_repeated_key_stores_nothing_and_still_reads_the_context(
    store: ConversationStore,
) -> None:
    who = avatar(3)
    first, before = store.record_and_context(who, Channel.PUBLIC, AvatarMessage(text="hi"), "7-0")
    store.record(who, Channel.PUBLIC, AgentReply(text="hello"))
    # When the same entry comes again (a redelivered stream message)
    again, context = store.record_and_context(who, Channel.PUBLIC, AvatarMessage(text="hi"), "7-0")
    # Then it is the first receipt, nothing new is stored, and the context is current
    assert again.duplicate and (again.session_id, again.seq) == (first.session_id, first.seq)
    assert _shape(before) == [("user", "hi")]
    assert _shape(context) == [("user", "hi"), ("assistant", "hello")]
    assert len(store.read_page(who, Channel.PUBLIC).turns) == 2


def test_after_the_ttl_the_context_holds_only_the_new_session(
    store: ConversationStore,
) -> None:
    who = avatar(4)
    old, _ = store.record_and_context(who, Channel.PUBLIC, AvatarMessage(text="before"))
    clock = store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(PUBLIC_TTL_MS)  # exactly the TTL: expired
    new, context = store.record_and_context(who, Channel.PUBLIC, AvatarMessage(text="after"))
    assert new.new_session and new.session_id != old.session_id
    assert _shape(context) == [("user", "after")]


def test_a_token_budget_is_applied_as_context_applies_it(store: ConversationStore) -> None:
    who = avatar(5)
    for n in range(6):
        store.record(who, Channel.IM, AvatarMessage(text=f"message number {n}"))
    _, fitted = store.record_and_context(
        who, Channel.IM, AvatarMessage(text="the newest"), max_tokens=40
    )
    assert _shape(fitted) == _shape(store.context(who, Channel.IM, max_tokens=40))
    assert fitted[-1].content == "the newest" and len(fitted) < 7


@pytest.mark.single_node  # counts the commands of a plain client
def test_bad_input_is_refused_before_any_command(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    command_counter.commands.clear()
    for bad in (
        lambda: store.record_and_context("not-a-uuid", Channel.IM, AvatarMessage(text="x")),
        lambda: store.record_and_context(avatar(6), "group", AvatarMessage(text="x")),
        lambda: store.record_and_context(avatar(6), Channel.IM, {"kind": "system", "text": "x"}),
        lambda: store.record_and_context(
            avatar(6), Channel.IM, AvatarMessage(text="x"), max_tokens=-1
        ),
    ):
        with pytest.raises(InvalidInput):
            bad()
    assert command_counter.commands == []


@pytest.mark.single_node  # counts the connections of a plain client
def test_it_is_one_round_trip_where_record_then_context_are_two(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    who = avatar(7)
    store.record(who, Channel.IM, AvatarMessage(text="warm up"))  # the layout is published first
    command_counter.commands.clear()
    store.record(who, Channel.IM, AvatarMessage(text="apart"), "1-0")
    store.context(who, Channel.IM)
    apart = command_counter.commands.count("<connection>")
    command_counter.commands.clear()
    store.record_and_context(who, Channel.IM, AvatarMessage(text="fused"), "2-0")
    # one connection taken, one write on it (MULTI, FCALL, the reads, EXEC): nothing else
    assert command_counter.commands == ["<connection>"]
    assert apart == 2


# -- record_in_session: an answer only into the session whose context it answers --------


def test_an_answer_goes_into_its_live_session(store: ConversationStore) -> None:
    who = avatar(8)
    words, _ = store.record_and_context(who, Channel.IM, AvatarMessage(text="hi"))
    answer = store.record_in_session(
        who, Channel.IM, AgentReply(text="hello"), words.session_id, "1-0:reply"
    )
    assert answer is not None and answer.session_id == words.session_id
    assert (answer.seq, answer.duplicate) == (words.seq + 1, False)
    again = store.record_in_session(
        who, Channel.IM, AgentReply(text="hello"), words.session_id, "1-0:reply"
    )
    assert again is not None and again.duplicate and again.seq == answer.seq
    assert _shape(store.context(who, Channel.IM)) == [("user", "hi"), ("assistant", "hello")]


@pytest.mark.parametrize("ending", ["delete", "expire", "ttl", "never"])
def test_an_answer_to_an_ended_session_is_stored_nowhere(
    store: ConversationStore, ending: str
) -> None:
    who = avatar(9)
    words, _ = store.record_and_context(who, Channel.PUBLIC, AvatarMessage(text="hi"))
    clock = store.clock
    assert isinstance(clock, ManualClock)
    if ending == "delete":
        assert store.delete(who, Channel.PUBLIC)
    elif ending == "expire":
        assert store.expire(who, Channel.PUBLIC)
    elif ending == "ttl":
        clock.advance(PUBLIC_TTL_MS)
    sid = words.session_id if ending != "never" else "0" * 32
    other = avatar(10) if ending == "never" else who
    answer = store.record_in_session(other, Channel.PUBLIC, AgentReply(text="reply"), sid)
    # Then nothing is stored, and no session starts with the answer
    assert answer is None
    assert store.context(other, Channel.PUBLIC) == []
    assert [m for m in store.list_metadata().items if m.avatar_uuid == other] == []
    assert store.read_page(other, Channel.PUBLIC).turns == []


@pytest.mark.single_node  # counts the commands of a plain client
def test_a_malformed_session_id_is_refused_before_any_command(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    command_counter.commands.clear()
    for bad in ("", "AB" * 16, "ab" * 15, "ab" * 16 + "\n", 12, None):
        with pytest.raises(InvalidInput, match="session_id"):
            store.record_in_session(avatar(11), Channel.IM, AgentReply(text="x"), bad)  # type: ignore[arg-type]
    assert command_counter.commands == []


def _a_second_script(on_the_sessions_slot: bool) -> ScriptCall[int]:
    """A script call to chain behind a record: one that reads the service's backlog,
    in the session's slot (a one-shard store's shard tag) or in the service's own."""
    space = KeySpace()
    keys = space.service()
    if on_the_sessions_slot:
        keys = dataclasses.replace(keys, inbound=space.shard(0).events)
    return Scripts().read_backlog(keys)


def test_the_answer_and_a_second_call_go_together(store: ConversationStore) -> None:
    who = avatar(12)
    words, _ = store.record_and_context(who, Channel.IM, AvatarMessage(text="hi"))
    for together in (True, False):  # one slot (one MULTI), or two (one after the other)
        then = _a_second_script(together)
        answer, backlog = store.record_in_session_then(
            who, Channel.IM, AgentReply(text=f"hello {together}"), words.session_id, None, then=then
        )
        assert answer is not None and answer.session_id == words.session_id
        assert isinstance(backlog, int)
    assert [m.content for m in store.context(who, Channel.IM)][-2:] == ["hello True", "hello False"]
    assert store.delete(who, Channel.IM)
    answer, _ = store.record_in_session_then(
        who, Channel.IM, AgentReply(text="late"), words.session_id, None, then=then
    )
    assert answer is None and store.context(who, Channel.IM) == []


@pytest.mark.single_node  # counts the connections of a plain client
def test_the_answer_and_the_second_call_are_one_round_trip(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    who = avatar(13)
    words, _ = store.record_and_context(who, Channel.IM, AvatarMessage(text="hi"))
    command_counter.commands.clear()
    store.record_in_session_then(
        who,
        Channel.IM,
        AgentReply(text="hello"),
        words.session_id,
        "1-0:reply",
        then=_a_second_script(False),
    )
    assert command_counter.commands == ["<connection>"]
