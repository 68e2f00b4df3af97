"""What an inbound entry is, as a worker reads it: its fields decoded strictly and
checked against the stream contract (docs/streams.md), or rejected with the
stable reason code its dead letter carries; and the entry IDs of a stream read,
in stream order. The queue's atomic steps are Lua (lua/take_inbound.lua,
claim_key.lua, begin_attempt.lua, finish_entry.lua); worker/service.py drives them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gridmem.errors import InvalidInput
from gridmem.keys import INBOUND_FIELDS
from gridmem.records import DeadLetterReason
from gridmem.validate import canonical_uuid
from gridmem.validate import parse_channel
from worker.llm import has_visible_text


class Rejected(Exception):
    """An inbound entry that cannot be answered; `reason` is its dead-letter code."""

    def __init__(self, reason: DeadLetterReason) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_inbound(raw: Sequence[tuple[bytes, bytes]], max_input_bytes: int) -> dict[str, str]:
    """An entry's fields as text, each decoded strictly; else Rejected.

    The bridge may write any bytes into any field, even one we never use: a field
    that is not UTF-8 is `bad_encoding`, one over the input ceiling `oversized`
    (checked first, so no oversized field is ever decoded).
    """
    if not raw:
        raise Rejected(DeadLetterReason.GONE)
    fields = {}
    for name, value in raw:
        if len(value) > max_input_bytes:
            raise Rejected(DeadLetterReason.OVERSIZED)
        try:
            fields[name.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected(DeadLetterReason.BAD_ENCODING) from None
    return fields


def check_inbound(fields: dict[str, str], max_input_bytes: int) -> tuple[str, str, str]:
    """(avatar UUID, channel, text) of a well-formed inbound entry, else Rejected."""
    if not fields:
        raise Rejected(DeadLetterReason.GONE)
    if set(fields) - INBOUND_FIELDS:
        raise Rejected(DeadLetterReason.UNKNOWN_FIELD)
    text = fields.get("text")
    if not text or not has_visible_text(text):
        raise Rejected(DeadLetterReason.MISSING_TEXT)
    if (
        len(text) > max_input_bytes
        or len(text.encode("utf-8", "surrogateescape")) > max_input_bytes
    ):
        raise Rejected(DeadLetterReason.OVERSIZED)
    try:
        uuid = canonical_uuid(fields.get("avatar_uuid"))
    except InvalidInput:
        raise Rejected(DeadLetterReason.BAD_UUID) from None
    try:
        channel = parse_channel(fields.get("channel")).value
    except InvalidInput:
        raise Rejected(DeadLetterReason.BAD_CHANNEL) from None
    return uuid, channel, text


def entry_ids(found: Any) -> list[str]:
    """Entry IDs of an XREAD reply: RESP2 [[stream, entries]] or RESP3 {stream: [entries]}."""
    if isinstance(found, dict):
        groups = [v[0] if v and isinstance(v[0], list) else v for v in found.values()]
    else:
        groups = [entries for _, entries in found or ()]
    return [
        e[0].decode() if isinstance(e[0], bytes) else str(e[0])
        for entries in groups
        for e in entries
    ]


def stream_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
