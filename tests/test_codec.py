"""The stored record format."""

from __future__ import annotations

import json

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st

from gridmem import CorruptRecord
from gridmem.codec import KIND_CODE
from gridmem.codec import decode_entries
from gridmem.codec import encode_payload
from gridmem.records import RecordKind


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


@given(
    kind=st.sampled_from(sorted(KIND_CODE)),
    fields=st.lists(st.text(), min_size=1, max_size=3),
)
@example(kind="avatar_message", fields=['"quoted" \\ back\nslash \x00 \u2028 \ud7ff \U0001f600'])
def test_payload_is_the_json_array_json_dumps_writes(kind: RecordKind, fields: list[str]) -> None:
    """encode_payload builds the array from string literals: byte for byte what the
    compact json.dumps of [code, *fields] writes, and what decoding reads back."""
    expected = json.dumps([KIND_CODE[kind], *fields], ensure_ascii=False, separators=(",", ":"))
    assert encode_payload(kind, fields) == expected
    assert json.loads(encode_payload(kind, fields)) == [KIND_CODE[kind], *fields]


def test_a_payload_field_that_is_not_text_is_refused() -> None:
    with pytest.raises(TypeError, match="not text"):
        encode_payload("avatar_message", [5])  # type: ignore[list-item]
