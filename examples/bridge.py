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

With `--partitions P` (the service's `[conversation] partitions`), each stream is
P streams: a message goes to the inbound stream of its avatar's partition
(`gridmem.partition_of`, crc32 of the lowercase UUID mod P), and the bridge reads
every partition's outbound stream, with a resume position for each, in one XREAD
(on one server; on a cluster, read each partition on its own: docs/streams.md).

Needs redis-py and gridmem (`pip install gridmem`, for the partition and stream
names; a bridge in another language computes them from docs/streams.md). Stop it
with Ctrl-C or SIGTERM.
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
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from gridmem import InvalidAvatarId
from gridmem import partition_of
from gridmem import service_streams

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
    """Where to resume: the last entry handled of each outbound stream (one per
    partition) and the replies delivered lately."""

    last_ids: list[str]
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_REPLIES))

    def __post_init__(self) -> None:
        self._seen = set(self.recent)

    @property
    def last_id(self) -> str:
        return ",".join(self.last_ids)

    def _name(self, partition: int, reply: Reply) -> str:
        # entry IDs are per stream: two partitions may each have a `1700000000000-0`
        return reply.in_reply_to if len(self.last_ids) == 1 else f"{partition}/{reply.in_reply_to}"

    def seen(self, partition: int, reply: Reply) -> bool:
        return self._name(partition, reply) in self._seen

    def delivered(self, partition: int, entry_id: str, reply: Reply) -> None:
        if len(self.recent) == self.recent.maxlen:
            self._seen.discard(self.recent[0])  # about to fall out of the window
        name = self._name(partition, reply)
        self.recent.append(name)
        self._seen.add(name)
        self.last_ids[partition] = entry_id

    @classmethod
    def load(cls, path: Path, partitions: int) -> State | None:
        """The saved state, or None on a first start (or a saved one for another
        number of partitions: then each stream starts after its newest entry)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        recent = deque(data["recent"], maxlen=RECENT_REPLIES)
        last_ids = data.get("last_ids", [data.get("last_id")])
        if len(last_ids) != partitions or not all(isinstance(i, str) for i in last_ids):
            return None
        return cls(last_ids=last_ids, recent=recent)

    def save(self, path: Path) -> None:
        """Write the state atomically: a temporary file, fsync, then rename over the old
        one. A crash leaves the old state or the new one, never half of either."""
        position: dict[str, Any] = (
            {"last_id": self.last_ids[0]}
            if len(self.last_ids) == 1
            else {"last_ids": self.last_ids}
        )
        data = json.dumps({**position, "recent": list(self.recent)})
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
    def __init__(
        self, client: redis.Redis, namespace: str, state_path: Path, partitions: int = 1
    ) -> None:
        self.client = client
        self.partitions = partitions
        streams = service_streams(namespace, partitions)
        self.inbound = [keys.inbound for keys in streams]
        self.outbound = [keys.outbound for keys in streams]
        self.state_path = state_path
        self.stopping = threading.Event()
        # First start: replies from now on. Resolved to IDs now, not read as "$"
        # later, so a reply published before the first read is not skipped.
        self.state = State.load(state_path, partitions) or State(
            last_ids=[self._newest(stream) for stream in self.outbound]
        )

    def post(self, message: dict[str, str]) -> str:
        """Put one resident's message on the inbound stream of its avatar's partition;
        its entry ID names it from then on."""
        fields = {name: message[name] for name in INBOUND_FIELDS if message.get(name)}
        try:
            partition = partition_of(fields.get("avatar_uuid", ""), self.partitions)
        except InvalidAvatarId:
            partition = 0  # not a UUID: the service dead-letters it (bad_uuid) wherever it is
        stream = self.inbound[partition]
        entry_id = str(self.client.xadd(stream, fields))  # type: ignore[arg-type]
        log.info("posted %s (%s, %s)", entry_id, fields.get("avatar_uuid"), fields.get("channel"))
        return entry_id

    def run(self) -> None:
        """Deliver replies until stop(): each new one once, the state saved after each."""
        while not self.stopping.is_set():
            positions = dict(zip(self.outbound, self.state.last_ids, strict=True))
            try:
                found: Any = self.client.xread(positions, block=BLOCK_MS)  # type: ignore[arg-type]
            except redis.ConnectionError:
                log.warning("redis unreachable; retrying")  # e.g. the service restarting
                self.stopping.wait(1.0)
                continue
            for stream, entries in found or ():
                partition = self.outbound.index(stream)
                for entry_id, fields in entries:
                    self._handle(partition, entry_id, Reply.from_fields(fields))

    def _handle(self, partition: int, entry_id: str, reply: Reply) -> None:
        if self.state.seen(partition, reply):
            log.info("dropped a repeat of the reply to %s", reply.in_reply_to)
            self.state.last_ids[partition] = entry_id  # saved with the next reply
            return
        say(reply)
        self.state.delivered(partition, entry_id, reply)
        self.state.save(self.state_path)

    def stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stopping.set()

    def _newest(self, stream: str) -> str:
        newest: Any = self.client.xrevrange(stream, count=1)
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
        "--partitions",
        type=int,
        default=int(os.environ.get("GRIDMEM_CONVERSATION__PARTITIONS") or 1),
        help="the service's [conversation] partitions "
        "(default: $GRIDMEM_CONVERSATION__PARTITIONS, else %(default)s)",
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
            bridge = Bridge(client, args.namespace, args.state, args.partitions)
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
