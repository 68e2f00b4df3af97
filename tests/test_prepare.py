"""Input ceiling, truncation and the order of the cleaning steps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import InputTooLarge
from worker.prepare import TRUNCATION_MARKER, check_size, truncate


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
