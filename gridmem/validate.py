"""Checks on caller input, run before any Redis command is sent.

Each failure raises an `InvalidInput` subclass naming the field. Nothing here
echoes the offending value back: it may be a secret pasted in the wrong place.

Every accepted value is returned as a plain `str` or `int`, never the caller's
subclass: redis-py encodes a str with its `.encode()` and an int with its
`repr()`, which a subclass may override, so what was checked would not be what
is sent. Digits are ASCII only (`[0-9]`, not `\\d` or `str.isdigit()`, which take
Arabic-Indic, full-width and superscript digits), and numbers that reach Redis
are checked against its 64-bit range here, not left to fail there.
"""

from __future__ import annotations

import re

from gridmem.errors import InvalidAvatarId
from gridmem.errors import InvalidChannel
from gridmem.errors import InvalidInput
from gridmem.ids import SESSION_ID
from gridmem.ids import UUID_ANY_CASE
from gridmem.ids import UUID_CANONICAL
from gridmem.records import Channel
from gridmem.records import channel_named

_UUID = re.compile(UUID_ANY_CASE)
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_STREAM_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_MEMBER = re.compile(UUID_CANONICAL + r":(public|im)")
_SHARD_NUMBER = re.compile(r"[0-9]{1,4}")
_SESSION_ID = re.compile(SESSION_ID)

PAGE_LIMIT_MAX = 200
METADATA_LIMIT_MAX = 1000
EVENTS_COUNT_MAX = 10_000
# A stream ID's parts are unsigned 64-bit; a sequence number is a signed 64-bit INCR.
STREAM_ID_PART_MAX = 2**64 - 1
SEQ_MAX = 2**63 - 1


def plain_str(value: object) -> str | None:
    """`value` as a plain str if it is a str (or a subclass), else None."""
    return str.__str__(value) if isinstance(value, str) else None


def plain_int(value: object) -> int | None:
    """`value` as a plain int if it is an int (or a subclass) and not a bool, else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int.__int__(value)


def canonical_uuid(value: object, field: str = "avatar_uuid") -> str:
    """The UUID in lowercase 8-4-4-4-12 form; anything else is refused."""
    text = plain_str(value)
    if text is None or not _UUID.fullmatch(text):
        raise InvalidAvatarId(field, "must be a UUID in 8-4-4-4-12 hexadecimal form")
    return text.lower()


# A channel's exact lowercase name: the hot path of parse_channel (every record and read).
_CHANNEL_BY_NAME: dict[str, Channel] = {channel.value: channel for channel in Channel}


def parse_channel(value: object) -> Channel:
    """Channel.PUBLIC or Channel.IM, named in any ASCII case (`IM`, `Public`), like a
    UUID; no whitespace, no look-alikes. Group and conference chat are not representable."""
    if isinstance(value, Channel):
        return value
    if type(value) is str:  # the common spelling, exactly: one dict lookup
        exact = _CHANNEL_BY_NAME.get(value)
        if exact is not None:
            return exact
    text = plain_str(value)  # compared as a plain str: a subclass's __eq__ is not asked
    channel = channel_named(text) if text is not None else None
    if channel is None:
        raise InvalidChannel(
            "channel", "must be 'public' or 'im', in any case (group/conference chat is not stored)"
        )
    return channel


def idempotency_key(value: object) -> str:
    """'' for none; otherwise 1-128 characters of [A-Za-z0-9_.:-] (a stream entry ID fits)."""
    if value is None:
        return ""
    text = plain_str(value)
    if text is None or not _IDEMPOTENCY_KEY.fullmatch(text):
        raise InvalidInput("idempotency_key", "must be 1-128 characters of A-Z a-z 0-9 _ . : -")
    return text


def session_id(value: object) -> str:
    """A session ID as the store issues them (Receipt.session_id): 32 lowercase hex digits."""
    text = plain_str(value)
    if text is None or not _SESSION_ID.fullmatch(text):
        raise InvalidInput("session_id", "must be a session ID: 32 lowercase hexadecimal digits")
    return text


def clamped_int(value: object, field: str, low: int, high: int) -> int:
    """An integer clamped into [low, high]; a non-integer (or a bool) is refused."""
    number = plain_int(value)
    if number is None:
        raise InvalidInput(field, "must be an integer")
    return max(low, min(high, number))


def page_anchor(value: object) -> int | None:
    """None, or a sequence number: 0 to 2**63 - 1 (the range of the INCR that made it)."""
    if value is None:
        return None
    number = plain_int(value)
    if number is None or not 0 <= number <= SEQ_MAX:
        raise InvalidInput("anchor", "must be None or a sequence number from 0 to 2**63 - 1")
    return number


def page_direction(value: object) -> str:
    text = plain_str(value)
    if text not in ("backward", "forward"):
        raise InvalidInput("direction", "must be 'backward' or 'forward'")
    return text


def stream_id(value: str, field: str) -> str:
    """A stream ID `<ms>-<seq>` in ASCII digits, each part within 64 bits, that an
    exclusive range can start after (Redis refuses to start after the very last ID)."""
    found = _STREAM_ID.fullmatch(value)
    if found is not None:
        ms, seq = int(found.group(1)), int(found.group(2))
        if max(ms, seq) <= STREAM_ID_PART_MAX and min(ms, seq) < STREAM_ID_PART_MAX:
            return value
    raise InvalidInput(field, "must be an event id as returned by events()")


def session_member(value: str, field: str) -> str:
    if not _MEMBER.fullmatch(value):
        raise InvalidInput(field, "must be a cursor as returned by list_metadata()")
    return value


def shard_number(value: str, shards: int, field: str) -> int:
    """A shard number written in a cursor: ASCII digits, below the shard count."""
    if not _SHARD_NUMBER.fullmatch(value) or int(value) >= shards:
        raise InvalidInput(field, "must be None or a cursor as returned by list_metadata()")
    return int(value)
