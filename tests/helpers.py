"""Small shared test helpers."""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any


def avatar(n: int) -> str:
    """A deterministic avatar UUID for test number n (canonical lowercase)."""
    return str(uuid_mod.UUID(int=(0x5EED << 96) + n))


def all_keys(client: object) -> set[str]:
    keys = client.keys("*")  # type: ignore[attr-defined]
    return {k.decode() if isinstance(k, bytes) else k for k in keys}


def _s(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def dump_all(client: object) -> str:
    """Every key and every value in the server, as one text to search."""
    c: Any = client
    out = []
    for raw_key in c.keys("*"):
        key = _s(raw_key)
        kind = _s(c.type(raw_key))
        out.append(key)
        if kind == "string":
            out.append(_s(c.get(raw_key)))
        elif kind == "hash":
            out.extend(_s(x) for kv in c.hgetall(raw_key).items() for x in kv)
        elif kind == "zset":
            out.extend(_s(m) for m, _ in c.zrange(raw_key, 0, -1, withscores=True))
        elif kind == "list":
            out.extend(_s(x) for x in c.lrange(raw_key, 0, -1))
        elif kind == "set":
            out.extend(_s(x) for x in c.smembers(raw_key))
        elif kind == "stream":
            for _, fields in c.xrange(raw_key):
                out.extend(_s(x) for kv in fields.items() for x in kv)
        else:
            raise AssertionError(f"unexpected key type {kind}")
    return "\n".join(out)
