"""The record kinds, once: what each is stored as and how it reads back.

One row per kind serves the codec (its payload code and field names), the context
read (role, untrusted), validation and snapshots (the record models name their
kind), and the Lua prelude (gridmem/library.py emits the codes as KIND_CODE, which
lib.lua summary_line reads). Standard library only, imported by everything.
"""

from __future__ import annotations

from typing import NamedTuple


class Kind(NamedTuple):
    name: str  # the record's `kind`, as callers and snapshots spell it
    code: str  # its one-letter code in a stored payload: ["a", text]
    role: str  # who said it, in context()
    untrusted: bool  # whether its words may be believed as instructions
    fields: tuple[str, ...]  # the payload's fields after the code: the model's field names
    # Its summary line's head, around the fields before the last one: the head is
    # head[0] + fields[0] + head[1] + ... and the last field is the line's text
    # (lua/lib.lua summary_line, gridmem/prepare.py fold_line's heads).
    head: tuple[str, ...]

    def summary_head(self, *leading: str) -> str:
        """The summary head for the fields before the text (as many as head has gaps)."""
        out = self.head[0]
        for value, part in zip(leading, self.head[1:], strict=True):
            out += value + part
        return out


KINDS: tuple[Kind, ...] = (
    Kind("avatar_message", "a", "avatar", True, ("text",), ("- avatar (untrusted): ",)),
    Kind("agent_reply", "r", "agent", False, ("text",), ("- agent: ",)),
    Kind("tool_summary", "t", "tool", True, ("tool", "summary"), ("- tool ", " (untrusted): ")),
    Kind(
        "action_result",
        "x",
        "agent",
        False,
        ("action", "status", "detail"),
        ("- action ", " ", ": "),
    ),
)
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}
BY_CODE: dict[str, Kind] = {kind.code: kind for kind in KINDS}
