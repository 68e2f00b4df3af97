"""Input ceiling, truncation and the order of the cleaning steps."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem import InputTooLarge
from gridmem import InvalidRecord
from gridmem import Limits
from gridmem import ToolSummary
from gridmem.config import MIN_TEXT_BYTES
from gridmem.config import SUMMARY_LINE_BYTES
from gridmem.prepare import AVATAR_HEAD
from gridmem.prepare import TRUNCATION_MARKER
from gridmem.prepare import WITHHELD
from gridmem.prepare import Preparer
from gridmem.prepare import check_size
from gridmem.prepare import fold_line
from gridmem.prepare import truncate
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.redaction import Redactor
from gridmem.redaction import Rule
from gridmem.redaction import redact
from tests.helpers import avatar
from tests.test_restore_roundtrip import CONTROL
from tests.test_restore_roundtrip import fold_head
from tests.test_restore_roundtrip import texts_near_bounds

pytestmark = pytest.mark.both_doors  # every store test, through both doors

A = avatar(1)


@given(
    st.text(min_size=0, max_size=300), st.integers(min_value=len(TRUNCATION_MARKER), max_value=400)
)
def test_truncation_is_valid_utf8_within_limit(text: str, limit: int) -> None:
    text = text.encode("utf-8", "ignore").decode("utf-8")  # drop lone surrogates
    bounded, truncated = truncate(text, limit)
    data = bounded.encode("utf-8")
    assert len(data) <= limit
    if truncated:
        assert bounded.endswith(TRUNCATION_MARKER)
        assert text.startswith(bounded[: -len(TRUNCATION_MARKER)])
    else:
        assert bounded == text


def test_multibyte_cut_never_splits_a_character() -> None:
    text = "🙂" * 10  # 4 bytes each
    bounded, truncated = truncate(text, 4 * 3 + len(TRUNCATION_MARKER) + 2)
    assert truncated and bounded == "🙂" * 3 + TRUNCATION_MARKER


def test_input_ceiling_counts_bytes() -> None:
    with pytest.raises(InputTooLarge, match="text"):
        check_size("é" * 6, "text", 11)
    check_size("é" * 5, "text", 10)


# -- what the write path stores is what restore accepts (issue 12 item 1) -----------------

PREPARE_LIMITS = [
    Limits(),
    Limits(max_text_bytes=MIN_TEXT_BYTES, max_tool_result_bytes=MIN_TEXT_BYTES),
    Limits(max_text_bytes=40, max_summary_bytes=SUMMARY_LINE_BYTES),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_stored_text_and_its_summary_line_are_fixed_points_of_redaction(
    data: st.DataObject,
) -> None:
    """Restore refuses text that redaction would still change: never store one.

    Each kind's free text, at and over its bound, with secrets of every family,
    control characters and key-shaped runs at the cuts.
    """
    limits = data.draw(st.sampled_from(PREPARE_LIMITS))
    kind = data.draw(st.sampled_from(["avatar", "agent", "tool", "action"]))
    head = fold_head(kind, "web.fetch", "failed")
    text = data.draw(texts_near_bounds(limits, kind, head))
    bound = limits.max_tool_result_bytes if kind == "tool" else limits.max_text_bytes
    try:
        out, _, _ = Preparer(limits, DEFAULT_REDACTOR).text(
            text, "text", bound, head, required=kind != "action"
        )
    except (InputTooLarge, InvalidRecord):
        assert len(text.encode()) > limits.max_input_bytes or all(c in CONTROL for c in text)
        return
    line = fold_line(head, out, SUMMARY_LINE_BYTES)[0]
    assert len(out.encode()) <= bound
    assert redact(out)[0] == out
    assert redact(line)[0] == line


def test_a_cut_never_leaves_the_shape_of_a_key() -> None:
    """A 24-character AKIA run is no AWS key; cut after 20 characters it is one."""
    key_shape = "AKIA" + "QZ7Q" * 4  # what the cut would leave: 20 characters
    text = "x " + key_shape + "QZ7Q" + " and more words"
    assert redact(text) == (text, 0)  # not a key as sent
    limits = Limits(max_text_bytes=2 + len(key_shape) + len(TRUNCATION_MARKER))
    out, count, truncated = Preparer(limits, DEFAULT_REDACTOR).text(text, "text", 34)
    assert truncated and count >= 1
    assert key_shape not in out and len(out.encode()) <= 34
    assert redact(out)[0] == out


def test_a_summary_cut_never_leaves_the_shape_of_a_key() -> None:
    """The summary line cuts a long text at its own bound: no key may end there either."""
    key_shape = "AKIA" + "Q" * 16
    room = SUMMARY_LINE_BYTES - len(AVATAR_HEAD) - len(" [...]")
    text = "x" * (room - len(key_shape) - 1) + " " + key_shape + "QQQQ end"
    assert redact(text) == (text, 0)
    out, _, _ = Preparer(Limits(), DEFAULT_REDACTOR).text(text, "text", 8192, AVATAR_HEAD)
    line = fold_line(AVATAR_HEAD, out, SUMMARY_LINE_BYTES)[0]
    assert key_shape not in line and redact(line)[0] == line


def test_a_secret_formed_by_joining_lines_costs_only_the_secret() -> None:
    """Regression: a fold that formed a match stored the summary line (240 bytes) instead.

    The summary joins a record's lines; "password\n= x" becomes an assignment there.
    The stored text is joined and redacted, and everything else of it is kept.
    """
    story = " and a long story follows." * 40
    text = "hello there\nmy password\n= hunter2xyz\n" + story
    assert redact(text) == (text, 0)  # across lines: no assignment as sent
    out, count, truncated = Preparer(Limits(), DEFAULT_REDACTOR).text(
        text, "text", 8192, AVATAR_HEAD
    )
    assert "hunter2xyz" not in out and count == 1 and not truncated
    assert out.endswith(story) and out.startswith("hello there my password = ")
    line = fold_line(AVATAR_HEAD, out, SUMMARY_LINE_BYTES)[0]
    assert redact(out)[0] == out and redact(line)[0] == line


def test_a_key_shaped_by_the_summary_cut_costs_only_that_run() -> None:
    """Regression: a summary cut that shaped a key stored only the line's 240 bytes."""
    key_shape = "AKIA" + "Q" * 16
    room = SUMMARY_LINE_BYTES - len(AVATAR_HEAD) - len(" [...]")
    tail = " more words" * 50
    text = "x" * (room - len(key_shape) - 1) + " " + key_shape + "QQQQ end" + tail
    assert redact(text) == (text, 0)
    out, _, truncated = Preparer(Limits(), DEFAULT_REDACTOR).text(text, "text", 8192, AVATAR_HEAD)
    assert out.endswith("QQQQ end" + tail) and not truncated
    line = fold_line(AVATAR_HEAD, out, SUMMARY_LINE_BYTES)[0]
    assert key_shape not in line and redact(line)[0] == line and redact(out)[0] == out


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (AvatarMessage(text="\x00\x1b\x7f"), "text"),
        (AgentReply(text="\x85\x9f"), "text"),
        (ToolSummary(tool="map", summary="\r\x0b\x0c"), "summary"),
    ],
)
def test_text_of_only_control_characters_is_refused_before_redis(
    store: ConversationStore, command_counter: Any, record: Any, field: str
) -> None:
    """Stored as "", restore's models refused it and quarantined the generation."""
    with pytest.raises(InvalidRecord, match=rf"^{field}: .*control characters"):
        store.record(A, "im", record)
    assert command_counter.commands == []


def test_an_action_detail_may_be_empty_after_cleaning(store: ConversationStore) -> None:
    """detail defaults to "" in the model, so "" after cleaning is stored (restore accepts it)."""
    store.record(A, "im", ActionResult(action="give", status="ok", detail="\x07"))
    [turn] = store.read_page(A, "im").turns
    assert turn.kind == "action_result"


def _looping(pattern: str, *keywords: str) -> Redactor:
    """A redactor whose marker matches its own rule, so its output is never a fixed point."""
    return Redactor((Rule("loop", pattern, ("loop", *keywords), ("a loop",)),))


def test_text_that_never_settles_is_withheld() -> None:
    """The repair is bounded: a text redaction keeps changing is stored as WITHHELD."""
    redactor = _looping("loop")
    assert redactor.redact("a loop")[0] != redactor.redact(redactor.redact("a loop")[0])[0]
    out, count, truncated = Preparer(Limits(), redactor).text("a loop", "text", 8192)
    assert (out, truncated) == (WITHHELD, True) and count >= 1


def test_text_with_no_safe_form_is_refused() -> None:
    redactor = _looping("loop|withheld", "withheld")
    with pytest.raises(InvalidRecord, match=r"^text: cannot be stored"):
        Preparer(Limits(), redactor).text("a loop", "text", 8192)


# -- idempotency keys shaped as stream entry IDs skip the redactor (issue 16) -------------

ENTRY_KEYS = st.builds(
    lambda ms, seq, reply: f"{ms}-{seq}" + (":reply" if reply else ""),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.booleans(),
)


@given(key=ENTRY_KEYS)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_redaction_rule_matches_an_entry_id_key(key: str) -> None:
    """The shortcut in Preparer.name holds only while no rule of the table can match
    digits around a dash (with ":reply"): checked here against the whole table."""
    assert redact(key) == (key, 0)


def test_entry_id_keys_are_stored_and_other_keys_still_checked(store: ConversationStore) -> None:
    receipt = store.record(avatar(1), "im", AvatarMessage(text="hi"), "1700000000000-0:reply")
    assert receipt.seq >= 1
    with pytest.raises(ValueError, match="idempotency_key"):
        store.record(avatar(1), "im", AvatarMessage(text="hi"), "sk-ant-api03-" + "a" * 40)
