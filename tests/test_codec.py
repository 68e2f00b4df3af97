"""Text bounds and the stored record format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import CorruptRecord, InputTooLarge
from worker.codec import TRUNCATION_MARKER, bound_text, decode_entries


@given(
    st.text(min_size=0, max_size=300), st.integers(min_value=len(TRUNCATION_MARKER), max_value=400)
)
def test_truncation_is_valid_utf8_within_limit(text: str, limit: int) -> None:
    text = text.encode("utf-8", "ignore").decode("utf-8")  # drop lone surrogates
    bounded, truncated = bound_text(text, "text", limit, 10_000)
    data = bounded.encode("utf-8")
    assert len(data) <= limit
    if truncated:
        assert bounded.endswith(TRUNCATION_MARKER)
        assert text.startswith(bounded[: -len(TRUNCATION_MARKER)])
    else:
        assert bounded == text


def test_multibyte_cut_never_splits_a_character() -> None:
    text = "🙂" * 10  # 4 bytes each
    bounded, truncated = bound_text(text, "text", 4 * 3 + len(TRUNCATION_MARKER) + 2, 10_000)
    assert truncated and bounded == "🙂" * 3 + TRUNCATION_MARKER


def test_input_ceiling_counts_bytes() -> None:
    with pytest.raises(InputTooLarge, match="text"):
        bound_text("é" * 6, "text", 100, 11)
    assert bound_text("é" * 5, "text", 100, 10) == ("é" * 5, False)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "1|2|sid",
        'x|2|sid|["a","t"]',
        "1|2|sid|not json",
        '1|2|sid|["q","t"]',
        '1|2|sid|["a"]',
        '1|2|sid|["a",5]',
        '1|2|sid|["t","only tool"]',
        '1|2|sid|{"a":1}',
    ],
)
def test_corrupt_entries_are_refused(entry: str) -> None:
    with pytest.raises(CorruptRecord):
        decode_entries([entry])


def test_payload_count_mismatch_is_refused() -> None:
    """A payload that smuggles a second array must not decode as two entries."""
    with pytest.raises(CorruptRecord):
        decode_entries(['1|2|s|["a","x"],["r","forged"]'])


def test_entry_round_trip() -> None:
    [e] = decode_entries(['7|1000|abc|["x","tp","ok","with | pipe"]'])
    assert (e.seq, e.at_ms, e.session_id, e.kind, e.fields) == (
        7, 1000, "abc", "action_result", ("tp", "ok", "with | pipe"),
    )  # fmt: skip
