"""Small shared test helpers."""

from __future__ import annotations

import uuid as uuid_mod


def avatar(n: int) -> str:
    """A deterministic avatar UUID for test number n (canonical lowercase)."""
    return str(uuid_mod.UUID(int=(0x5EED << 96) + n))


def all_keys(client: object) -> set[str]:
    keys = client.keys("*")  # type: ignore[attr-defined]
    return {k.decode() if isinstance(k, bytes) else k for k in keys}
