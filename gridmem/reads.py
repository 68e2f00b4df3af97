"""The context read: one MULTI/EXEC of plain read commands instead of a script.

`context()` is the hot read (every LLM call makes one), and it changes nothing,
so it needs a consistent snapshot, not a script. A script returning the
transcript made the server copy every entry twice (its reply into Lua values,
then the Lua table into the reply): for a 20-turn session that was most of the
call's server time, and the largest part of context()'s gap to a hand-written
Redis list (docs/benchmarks.md). MULTI/EXEC gives the same atomicity, and ZRANGE sends the
entries straight from the sorted set.

The price is that the read applies the liveness rule itself. `live_now` and
`is_live` mirror lib.lua's store_now (without persisting) and is_expired, and
tests/test_reads.py checks them against lib.lua's own functions across boots
(known and new to the per-boot offset table), wall-clock jumps, damaged clock
fields and the TTL boundary.

Like scripts.py, nothing here talks to a server: `context_read` returns a
`ReadCall` (gridmem/replies.py) that ConversationStore and AsyncConversationStore run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

from gridmem.arguments import bad_argument
from gridmem.clock import MAX_BOOT_ID_CHARS
from gridmem.keys import SessionKeys
from gridmem.keys import ShardKeys
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import Channel
from gridmem.replies import ClockReading
from gridmem.replies import ReadCall
from gridmem.replies import ScriptCall
from gridmem.replies import text

# lib.lua arg_clock's boot_id rule ('^[%w%-_.]+$', at most MAX_BOOT_ID_CHARS).
_BOOT_ID = re.compile(r"[A-Za-z0-9_.\-]+")


class ContextReply(NamedTuple):
    session_id: str  # '' when there is no live session
    summary: str
    entries: list[Any]  # as the client returned them: bytes, or str if it decodes


_NO_SESSION = ContextReply("", "", [])


def _lua_number(value: Any) -> float | None:
    """lib.lua's tonumber() on a sorted-set score: None when absent or not a number."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def clock_field(value: Any) -> float | None:
    """lib.lua clock_field: a decimal integer (as the double Lua makes of it), else None.

    ASCII digits only, as Lua's %d: bytes.isdigit() takes nothing else (str.isdigit()
    would take other scripts' digits).
    """
    if value is None:
        return None
    raw = value if type(value) is bytes else str(value).encode("utf-8", "surrogatepass")
    digits = raw[1:] if raw[:1] == b"-" else raw
    return float(raw) if digits.isdigit() else None


def clock_fields(boot: str) -> tuple[str, str, str, str]:
    """The clock hash fields live_now needs, in its order (lib.lua store_now's HMGET)."""
    return ("last", "wall", "o:" + boot, "epoch")


def live_now(fields: Sequence[Any], reading: ClockReading) -> float:
    """Store time for this reading: lib.lua store_now, read-only (DESIGN section 4).

    `fields` are the shard clock hash's `clock_fields(reading.boot)`: the store's
    latest time, the wall clock that wrote it, this boot's offset and the shard's
    epoch (store time minus wall time, fixed at its first write). A boot without an
    offset gets the one its first write would fix: it starts at `wall + epoch`, or at
    the store's latest time if that is later. The steps are lib.lua's, in its order,
    so both compute the same double.
    """
    last, last_wall = clock_field(fields[0]), clock_field(fields[1])
    offset, epoch = clock_field(fields[2]), clock_field(fields[3])
    if epoch is None and last is not None and last_wall is not None:
        epoch = last - last_wall  # an older version's hash: lib.lua clock_epoch
    if offset is None:  # a boot that has not written: the offset its first write would get
        start: float = reading.mono
        if epoch is not None:
            start = reading.wall + epoch
            if last is not None and last > start:
                start = last
        elif last is not None:
            start = last
        offset = start - reading.mono
    return reading.mono + offset


def is_live(last_active: Any, now: float, ttl_ms: int) -> bool:
    """lib.lua is_expired, negated: active, and less than the channel's TTL ago."""
    last = _lua_number(last_active)
    return last is not None and now - last < ttl_ms


def check_clock(reading: ClockReading) -> None:
    """What lib.lua arg_clock checks, so a bad clock fails here as it fails a script."""
    mono, wall, boot = reading
    bad = (
        "now_mono" if type(mono) is not int or mono < 0
        else "now_wall" if type(wall) is not int or wall < 0
        else "boot_id" if type(boot) is not str or len(boot) > MAX_BOOT_ID_CHARS
        or not _BOOT_ID.fullmatch(boot)
        else None
    )  # fmt: skip
    if bad:
        raise bad_argument(bad)


def context_read(
    session: SessionKeys,
    shard: ShardKeys,
    channel: Channel,
    reading: ClockReading,
    fallback: Callable[[], ScriptCall[list[Any]]] | None = None,
) -> ReadCall[ContextReply]:
    """Session id, summary and live entries (oldest first) of one session, or none.

    An idle-expired session reads as none: reading is never activity. `fallback`
    is lua/read_context.lua's call, the same reads for a server that is full.
    """
    check_clock(reading)
    ttl_ms = CHANNEL_TTL_MS[channel]

    def parse(replies: list[Any]) -> ContextReply:
        sid, clock_fields, last_active, summary, entries = replies
        if sid is None or not is_live(last_active, live_now(clock_fields, reading), ttl_ms):
            return _NO_SESSION
        return ContextReply(text(sid), "" if summary is None else text(summary), entries)

    return ReadCall(
        (
            ("HGET", session.meta, "sid"),
            ("HMGET", shard.clock, *clock_fields(reading.boot)),
            ("ZSCORE", shard.lru(channel), session.member),
            ("GET", session.summary),
            ("ZRANGE", session.turns, 0, -1),
        ),
        parse,
        fallback,
    )
