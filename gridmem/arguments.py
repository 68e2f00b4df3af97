"""The argument checks of the calls that run no Lua, made before any command is sent.

A script checks its own arguments (lib.lua new_args) and answers "GM_BADARG
<field>". A call of plain commands (`CommandCall`, `ReadCall`: gridmem/replies.py)
has no script to do that, so its builder checks the same rules here and raises the
same error, BadScriptArgument naming the same field: either way a bad argument
never reaches Redis. Like a script's refusal, one is a bug in the caller: the
store and the service check what callers give them first (gridmem/validate.py).
"""

from __future__ import annotations

import re

from gridmem.errors import BadScriptArgument
from gridmem.ids import SESSION_ID
from gridmem.ids import UUID_CANONICAL
from gridmem.records import Channel
from gridmem.validate import plain_int
from gridmem.validate import plain_str

# The shapes the scripts checked, as Lua patterns read them ('%d' and '%w' are ASCII).
ENTRY_ID = re.compile(r"[0-9]+-[0-9]+")  # a stream entry ID, '^%d+%-%d+$'
NAME = re.compile(r"[A-Za-z0-9_.:\-]+")  # a group or consumer name, '^[%w%-_.:]+$'
CANONICAL_UUID = re.compile(UUID_CANONICAL)
SESSION_ID_RE = re.compile(SESSION_ID)
CHANNELS = frozenset(channel.value for channel in Channel)


def bad_argument(field: str) -> BadScriptArgument:
    """The error a script gives for a malformed argument `field`."""
    return BadScriptArgument("GM_BADARG", f"GM_BADARG {field}")


def matching(field: str, value: object, pattern: re.Pattern[str]) -> str:
    """`value` as a plain str if it is one `pattern` matches whole, else GM_BADARG field."""
    text = plain_str(value)
    if text is None or not pattern.fullmatch(text):
        raise bad_argument(field)
    return text


def one_of(field: str, value: object, allowed: frozenset[str]) -> str:
    """`value` as a plain str if it is one of `allowed`, else GM_BADARG field."""
    text = plain_str(value)
    if text not in allowed:
        raise bad_argument(field)
    return text


def integer(field: str, value: object, low: int, high: int | None = None) -> int:
    """`value` as a plain int within [low, high], else GM_BADARG field (a bool is none)."""
    number = plain_int(value)
    if number is None or number < low or (high is not None and number > high):
        raise bad_argument(field)
    return number
