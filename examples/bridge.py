#!/usr/bin/env python3
"""A grid bridge for `gridmem serve`, as small as it can be: copy it, then plug in your grid.

A bridge is the program logged in to the grid as the agent's avatar. This one
stands its standard streams in for the grid, one JSON object a line, so it runs
as is:

  a resident speaks   -> stdin:  {"avatar_uuid": "...", "channel": "im", "text": "hi",
                                  "avatar_name": "Ann Resident"}
  the agent answers   -> stdout: {"avatar_uuid": "...", "channel": "im", "text": "...",
                                  "in_reply_to": "...", "session_id": "..."}

Where your grid library calls you back with chat or an IM, call `post()`; where
this prints a reply, say it in local chat or send it as an IM. Everything else
is the stream contract (docs/streams.md):

- post each message to `gm:inbound` (XADD, no MAXLEN: the service deletes entries
  once answered);
- read `gm:outbound` with XREAD from the last entry handled;
- drop repeats by `in_reply_to` (the outbound stream is at-least-once);
- keep the last entry ID and the recent `in_reply_to`s in a small state file,
  written atomically after each reply, so a restart resumes where it stopped:
  no reply lost, none shown twice.

Needs only redis-py (`pip install redis`). Stop it with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis

log = logging.getLogger("bridge")

INBOUND_FIELDS = ("avatar_uuid", "channel", "text", "avatar_name")
# A repeat comes within about a lease (30 s by default) of the first copy: this
# many recent replies cover any plausible rate.
RECENT_REPLIES = 10_000
BLOCK_MS = 1000  # how long one XREAD waits; also how soon a stop is noticed


@dataclass(frozen=True)
class Reply:
    """One entry of gm:outbound."""

    avatar_uuid: str
    channel: str
    text: str
    in_reply_to: str
    session_id: str

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Reply:
        """An entry's fields; one missing is '' (an odd entry is shown, never a crash)."""
        return cls(**{name: fields.get(name, "") for name in cls.__dataclass_fields__})


@dataclass
class State:
    """Where to resume: the last outbound entry handled and the replies delivered lately."""

    last_id: str
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_REPLIES))

    def __post_init__(self) -> None:
        self._seen = set(self.recent)

    def seen(self, reply: Reply) -> bool:
        return reply.in_reply_to in self._seen

    def delivered(self, entry_id: str, reply: Reply) -> None:
        if len(self.recent) == self.recent.maxlen:
            self._seen.discard(self.recent[0])  # about to fall out of the window
        self.recent.append(reply.in_reply_to)
        self._seen.add(reply.in_reply_to)
        self.last_id = entry_id

    @classmethod
    def load(cls, path: Path) -> State | None:
        """The saved state, or None on a first start."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        recent = deque(data["recent"], maxlen=RECENT_REPLIES)
        return cls(last_id=str(data["last_id"]), recent=recent)

    def save(self, path: Path) -> None:
        """Write the state atomically: a temporary file, fsync, then rename over the old
        one. A crash leaves the old state or the new one, never half of either."""
        data = json.dumps({"last_id": self.last_id, "recent": list(self.recent)})
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)


class Bridge:
    def __init__(self, client: redis.Redis, namespace: str, state_path: Path) -> None:
        self.client = client
        self.inbound = f"{namespace}:inbound"
        self.outbound = f"{namespace}:outbound"
        self.state_path = state_path
        self.stopping = threading.Event()
        # First start: replies from now on. Resolved to an ID now, not read as "$"
        # later, so a reply published before the first read is not skipped.
        self.state = State.load(state_path) or State(last_id=self._newest_outbound())

    def post(self, message: dict[str, str]) -> str:
        """Put one resident's message on gm:inbound; its entry ID names it from then on."""
        fields = {name: message[name] for name in INBOUND_FIELDS if message.get(name)}
        entry_id = str(self.client.xadd(self.inbound, fields))  # type: ignore[arg-type]
        log.info("posted %s (%s, %s)", entry_id, fields.get("avatar_uuid"), fields.get("channel"))
        return entry_id

    def run(self) -> None:
        """Deliver replies until stop(): each new one once, the state saved after each."""
        while not self.stopping.is_set():
            try:
                found: Any = self.client.xread({self.outbound: self.state.last_id}, block=BLOCK_MS)
            except redis.ConnectionError:
                log.warning("redis unreachable; retrying")  # e.g. the service restarting
                self.stopping.wait(1.0)
                continue
            for _stream, entries in found or ():
                for entry_id, fields in entries:
                    self._handle(entry_id, Reply.from_fields(fields))

    def _handle(self, entry_id: str, reply: Reply) -> None:
        if self.state.seen(reply):
            log.info("dropped a repeat of the reply to %s", reply.in_reply_to)
            self.state.last_id = entry_id  # saved with the next reply
            return
        say(reply)
        self.state.delivered(entry_id, reply)
        self.state.save(self.state_path)

    def stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stopping.set()

    def _newest_outbound(self) -> str:
        newest: Any = self.client.xrevrange(self.outbound, count=1)
        return str(newest[0][0]) if newest else "0-0"


def say(reply: Reply) -> None:
    """Stands in for the grid: local chat for `public`, an IM to the resident for `im`."""
    print(json.dumps(asdict(reply)), flush=True)


def hear(bridge: Bridge) -> None:
    """Stands in for the grid's chat and IM callbacks: one JSON message a line on stdin."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
            bridge.post({k: str(v) for k, v in message.items()})
        except (ValueError, redis.RedisError) as exc:
            # a real bridge would retry a Redis error, or tell the resident
            log.warning("message not posted: %s", type(exc).__name__)


def connect(args: argparse.Namespace) -> redis.Redis:
    if args.redis_url:
        return redis.Redis.from_url(args.redis_url, decode_responses=True)
    return redis.Redis(unix_socket_path=args.socket, decode_responses=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "A grid bridge for `gridmem serve`: residents' messages (JSON lines on stdin) "
            "go to the inbound stream, the agent's replies come back as JSON lines on stdout, "
            "each once, across restarts."
        ),
        epilog=(
            "example, next to a `gridmem serve` started with defaults in this directory:\n"
            '  echo \'{"avatar_uuid": "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", '
            '"channel": "im", "text": "hello"}\' \\\n'
            "    | python examples/bridge.py          # Ctrl-C to stop\n"
            "stdin lines: avatar_uuid, channel (public or im), text, optional avatar_name.\n"
            "stdout lines: avatar_uuid, channel, text, in_reply_to, session_id.\n"
            "See docs/streams.md for the stream contract."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--socket",
        default="gridmem-data/valkey/valkey.sock",
        help="the private Valkey of a `gridmem serve` with default settings, started in "
        "this directory (default: %(default)s)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("GRIDMEM_REDIS__URL"),
        help="the service's [redis] url instead of the socket (default: $GRIDMEM_REDIS__URL)",
    )
    parser.add_argument(
        "--namespace",
        default="gm",
        help="the service's [conversation] namespace (default: %(default)s)",
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=Path("bridge-state.json"),
        help="where the resume position is kept (default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bridge: %(message)s", stream=sys.stderr)
    client = connect(args)
    while True:
        try:
            bridge = Bridge(client, args.namespace, args.state)
            break
        except redis.ConnectionError:
            log.warning("waiting for the service's Redis")
            time.sleep(1.0)
    signal.signal(signal.SIGINT, bridge.stop)
    signal.signal(signal.SIGTERM, bridge.stop)
    threading.Thread(target=hear, args=(bridge,), daemon=True).start()
    log.info("reading replies after %s", bridge.state.last_id)
    bridge.run()
    log.info("stopped; resume position %s saved in %s", bridge.state.last_id, args.state)
    bridge.state.save(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
