"""The stored record format."""

from __future__ import annotations

import pytest

from gridmem import CorruptRecord
from gridmem.codec import decode_entries


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
