"""Small shared test helpers."""

from __future__ import annotations

import queue
import subprocess
import threading
import uuid as uuid_mod
from typing import Any

from gridmem.keys import KeySpace


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
    for raw_key in sorted(c.keys("*")):  # KEYS order may change between two calls
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


def recompute(
    client: object, namespace: str = "gm", shard: int = 0, shards: int = 1
) -> dict[str, Any]:
    """Everything the bounds are about, recomputed from the keys themselves (one shard
    of `shards`)."""
    c: Any = client
    prefix = KeySpace(namespace, shards).prefix(shard)
    sessions: dict[str, dict[str, Any]] = {}
    orphans = []
    for raw in c.keys(prefix + "s:*"):
        key = _s(raw)
        member, part = key[len(prefix) + 2 :].rsplit(":", 1)
        sessions.setdefault(member, {})[part] = key
    for member, parts in sessions.items():
        if "meta" not in parts:
            orphans.append(member)
            continue
        meta = {_s(k): _s(v) for k, v in c.hgetall(parts["meta"]).items()}
        entries = [_s(e) for e in c.zrange(parts.get("turns", "none"), 0, -1)]
        summary = _s(c.get(parts["summary"]) or b"") if "summary" in parts else ""
        parts["meta_fields"] = meta
        parts["turns_count"] = len(entries)
        parts["tools_count"] = sum(1 for e in entries if e.split("|", 3)[3].startswith('["t"'))
        parts["bytes"] = sum(len(e.encode()) for e in entries) + len(summary.encode())
        parts["summary_bytes"] = len(summary.encode())
        archived = [_s(e) for e in c.zrange(parts.get("archive", "none"), 0, -1)]
        parts["archive_bytes"] = sum(len(e.encode()) for e in archived)
        parts["archive_count"] = len(archived)
    indexed = {_s(m) for m in c.zrange(prefix + "sessions", 0, -1)}
    lru = {_s(m) for m in c.zrange(prefix + "lru:public", 0, -1)} | {
        _s(m) for m in c.zrange(prefix + "lru:im", 0, -1)
    }
    return {
        "sessions": {m: p for m, p in sessions.items() if m not in orphans},
        "orphans": orphans,
        "indexed": indexed,
        "lru": lru,
        "stats_bytes": int(_s(c.hget(prefix + "stats", "bytes") or b"0")),
        "events": c.xlen(prefix + "events") if c.exists(prefix + "events") else 0,
    }


class OutputLines:
    """A child process's stdout, line by line, read in a thread so a test can wait for
    the next line with a deadline instead of blocking on the pipe for ever."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def next(self, timeout: float) -> str | None:
        """The next line, or None if none came within `timeout` seconds."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def finish(self, timeout: float) -> list[str]:
        """After the process ended: the lines not taken yet, the pipe read to its end."""
        self._reader.join(timeout=timeout)
        rest = []
        while not self._lines.empty():
            rest.append(self._lines.get())
        return rest
