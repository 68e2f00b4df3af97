"""The one spelling of a UUID and a session ID, for Python regexes and the Lua prelude.

A UUID is 8-4-4-4-12 hexadecimal digits. Callers may write it in any case
(validation lowers it); what is stored (session members, snapshots) is lowercase.
gridmem/library.py carries UUID_LUA and SESSION_ID_LUA into the Lua prelude.
Standard library only.
"""

from __future__ import annotations

UUID_GROUPS = (8, 4, 4, 4, 12)


def uuid_regex(digit: str) -> str:
    """A UUID as a Python regex over the digit class `digit`."""
    return "-".join(f"{digit}{{{n}}}" for n in UUID_GROUPS)


UUID_ANY_CASE = uuid_regex("[0-9a-fA-F]")  # as callers (and chat, for redaction) write one
UUID_CANONICAL = uuid_regex("[0-9a-f]")  # as the store keeps one
SESSION_ID_DIGITS = 32  # a session ID: 128 random bits, as lowercase hex
SESSION_ID = f"[0-9a-f]{{{SESSION_ID_DIGITS}}}"
# The same as Lua patterns (no anchors): a canonical UUID, and a session ID.
UUID_LUA = "%-".join("[0-9a-f]" * n for n in UUID_GROUPS)
SESSION_ID_LUA = "[0-9a-f]" * SESSION_ID_DIGITS
