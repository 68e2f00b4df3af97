"""Checks on caller input, run before any Redis command is sent.

Each failure raises an `InvalidInput` subclass naming the field. Nothing here
echoes the offending value back: it may be a secret pasted in the wrong place.
"""

from __future__ import annotations

import re

from worker.errors import InvalidAvatarId, InvalidChannel, InvalidInput
from worker.records import Channel

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}")
_MEMBER = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:(public|im)")

PAGE_LIMIT_MAX = 200
METADATA_LIMIT_MAX = 1000
EVENTS_COUNT_MAX = 10_000


def canonical_uuid(value: object, field: str = "avatar_uuid") -> str:
    """The UUID in lowercase 8-4-4-4-12 form; anything else is refused."""
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        raise InvalidAvatarId(field, "must be a UUID in 8-4-4-4-12 hexadecimal form")
    return value.lower()


def parse_channel(value: object) -> Channel:
    """Channel.PUBLIC or Channel.IM. Group and conference chat are not representable."""
    if isinstance(value, Channel):
        return value
    if isinstance(value, str):
        for channel in Channel:
            if value == channel.value:
                return channel
    raise InvalidChannel(
        "channel", "must be 'public' or 'im' (group/conference chat is not stored)"
    )


def idempotency_key(value: object) -> str:
    """'' for none; otherwise 1-128 characters of [A-Za-z0-9_.:-] (a stream entry ID fits)."""
    if value is None:
        return ""
    if not isinstance(value, str) or not _IDEMPOTENCY_KEY.fullmatch(value):
        raise InvalidInput("idempotency_key", "must be 1-128 characters of A-Z a-z 0-9 _ . : -")
    return value


def clamped_int(value: object, field: str, low: int, high: int) -> int:
    """An integer clamped into [low, high]; a non-integer is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, "must be an integer")
    return max(low, min(high, value))


def page_anchor(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput("anchor", "must be None or a sequence number >= 0")
    return value


def page_direction(value: object) -> str:
    if value not in ("backward", "forward"):
        raise InvalidInput("direction", "must be 'backward' or 'forward'")
    return str(value)


def stream_id(value: str, field: str) -> str:
    if not _STREAM_ID.fullmatch(value):
        raise InvalidInput(field, "must be an event id as returned by events()")
    return value


def session_member(value: str, field: str) -> str:
    if not _MEMBER.fullmatch(value):
        raise InvalidInput(field, "must be a cursor as returned by list_metadata()")
    return value
