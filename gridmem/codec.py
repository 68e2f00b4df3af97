"""The stored form of a record: what Lua writes into a transcript, and how it is read back.

A transcript entry (a sorted-set member) is

    <seq>|<wall ms>|<session id>|<payload>

where Lua prepends the first three (the sequence is assigned inside the script)
and the payload is a compact JSON array made here: `["a", text]` for an avatar
message, `["r", text]` agent reply, `["t", tool, summary]` tool summary,
`["x", action, status, detail]` action result. The seq prefix keeps every
member unique. Python is the only writer of payloads and the only reader of entries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple
from typing import cast

from gridmem.errors import CorruptRecord
from gridmem.kinds import KINDS
from gridmem.records import RecordKind

# The payload code and fields of each kind (gridmem/kinds.py, the one table of them).
KIND_CODE: dict[RecordKind, str] = {cast(RecordKind, k.name): k.code for k in KINDS}
CODE_KIND: dict[str, RecordKind] = {code: kind for kind, code in KIND_CODE.items()}
# The payload's fields after the kind code, by kind: the record models' field names.
FIELD_NAMES: dict[RecordKind, tuple[str, ...]] = {cast(RecordKind, k.name): k.fields for k in KINDS}
_FIELD_COUNT = {KIND_CODE[kind]: len(names) for kind, names in FIELD_NAMES.items()}


# A JSON string literal, as json.dumps(value, ensure_ascii=False) writes one: the
# encoder's own string function (C where the json module has its speedups).
_STRING: Callable[[str], str] = json.encoder.encode_basestring


def encode_payload(kind: RecordKind, fields: list[str]) -> str:
    """The payload Lua stores after its `<seq>|<wall>|<sid>|` prefix: the compact JSON
    array json.dumps([code, *fields], ensure_ascii=False, separators=(",", ":")) is,
    built from its string literals (an encoder object per call cost ~4 us per record;
    tests/test_codec.py holds the two equal). Every field is a str: anything else is
    a bug, refused rather than written as JSON of another shape."""
    for value in fields:
        if type(value) is not str:
            raise TypeError(f"payload field is not text: {type(value).__name__}")
    return "[" + ",".join([_STRING(KIND_CODE[kind]), *map(_STRING, fields)]) + "]"


class StoredEntry(NamedTuple):
    """One transcript entry as read back: kind plus its fields, in payload order.

    A NamedTuple, not a model: the read path builds one per record per call.
    """

    seq: int
    at_ms: int
    session_id: str
    kind: RecordKind
    fields: tuple[str, ...]


def read_entries(
    entries: list[str], session_id: str | None = None
) -> tuple[list[list[str]], list[list[str]]]:
    """(heads, payloads) of transcript entries, checked; anything malformed is CorruptRecord.

    A head is [seq, wall ms, session id, raw payload]; a payload is [code, field, ...]
    with every field a string. With `session_id`, every entry must carry it:
    isolation is enforced by keys, this catches a store damaged from outside.

    The payloads are parsed in one json.loads call (a JSON array of them): the
    read path's cost is dominated by per-entry parsing, and Python wrote every
    payload as exactly one JSON array, so a count mismatch reveals tampering.
    """
    if not entries:
        return [], []
    try:
        heads = [entry.split("|", 3) for entry in entries]
        payloads = json.loads("[" + ",".join([head[3] for head in heads]) + "]")
        if len(payloads) != len(heads):
            raise ValueError("payload count")
        for head, payload in zip(heads, payloads, strict=True):
            if session_id is not None and head[2] != session_id:
                raise ValueError("entry of another session")
            if type(payload) is not list or len(payload) != _FIELD_COUNT[payload[0]] + 1:
                raise ValueError("wrong fields")
            for value in payload:
                if type(value) is not str:
                    raise TypeError("field is not text")
    except (ValueError, KeyError, TypeError, IndexError):
        raise CorruptRecord("a stored transcript entry cannot be decoded") from None
    return heads, payloads


def decode_entries(entries: list[str], session_id: str | None = None) -> list[StoredEntry]:
    """Transcript entries as StoredEntry values (see read_entries)."""
    heads, payloads = read_entries(entries, session_id)
    try:
        return [
            StoredEntry(int(h[0]), int(h[1]), h[2], CODE_KIND[p[0]], tuple(p[1:]))
            for h, p in zip(heads, payloads, strict=True)
        ]
    except ValueError:
        raise CorruptRecord("a stored transcript entry cannot be decoded") from None


def entry_to_record(entry: StoredEntry) -> dict[str, str]:
    """A stored entry as the mapping its record model takes (kind included)."""
    return {"kind": entry.kind, **dict(zip(FIELD_NAMES[entry.kind], entry.fields, strict=True))}


def record_to_entry(seq: int, at_ms: int, session_id: str, record: dict[str, str]) -> str:
    """The transcript member for a validated record mapping: what Lua would have written."""
    kind: RecordKind = record["kind"]  # type: ignore[assignment]  # validated by the caller
    fields = [record[name] for name in FIELD_NAMES[kind]]
    return f"{seq}|{at_ms}|{session_id}|{encode_payload(kind, fields)}"
