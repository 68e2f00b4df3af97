"""examples/bridge.py against a running `gridmem serve`, as a bridge author runs it.

Regression (issue 13, item 9): nothing showed how a grid bridge talks to the
service. The example posts residents' messages (JSON lines on its stdin) to
gm:inbound and shows the replies (JSON lines on its stdout): each message gets
exactly one reply shown, across a stop mid-run and a restart (the resume position
lives in a state file), and a repeated outbound entry is dropped by in_reply_to.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import IO

import pytest

from tests.helpers import avatar
from tests.test_service import Service
from tests.test_service import _start
from tests.test_service import _stop
from tests.test_service import base
from worker.localllm import LocalChatServer

__all__ = ["base"]  # the fixture: a short temporary directory for the service

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "bridge.py"
DEADLINE = 60.0
POSTED = re.compile(r"posted (\d+-\d+) ")


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


@dataclass
class BridgeRun:
    """One run of the example: what it printed, read by threads so it never blocks."""

    process: subprocess.Popen[str]
    out: queue.Queue[str] = field(default_factory=queue.Queue)
    err: queue.Queue[str] = field(default_factory=queue.Queue)
    shown: list[dict[str, str]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def start_reading(self) -> None:
        for stream, into in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            reader = threading.Thread(target=_lines, args=(stream, into), daemon=True)
            reader.start()
            self.readers.append(reader)

    def say(self, who: int, channel: str, text: str, **extra: str) -> None:
        message = {"avatar_uuid": avatar(who), "channel": channel, "text": text, **extra}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.shown.append(json.loads(self.out.get_nowait()))
        with contextlib.suppress(queue.Empty):
            while True:
                self.said.append(self.err.get_nowait())

    def posted(self) -> list[str]:
        """The inbound entry IDs of the messages it posted (it logs each, no text)."""
        self.drain()
        return [m.group(1) for line in self.said if (m := POSTED.search(line))]

    def count(self) -> int:
        self.drain()
        return len(self.shown)

    def started(self) -> bool:
        self.drain()
        return any("reading replies after" in line for line in self.said)

    def stop(self, how: int = signal.SIGINT) -> None:
        """Ctrl-C (or SIGTERM): the bridge finishes the reply in hand and saves its state."""
        self.process.send_signal(how)
        code = self.process.wait(timeout=DEADLINE)
        for reader in self.readers:  # they end with the pipes: everything printed is read
            reader.join(timeout=DEADLINE)
        self.drain()
        assert code == 0, "".join(self.said)


@contextlib.contextmanager
def bridge(service: Service, state: Path) -> Iterator[BridgeRun]:
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--redis-url", service.client_url(), "--state", str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = BridgeRun(process)
    run.start_reading()
    try:
        until(run.started, "the bridge to start")
        yield run
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling other processes, with a deadline


def _replied(service: Service, ids: list[str]) -> Callable[[], bool]:
    """True once the service has published a reply to every one of `ids`."""

    def check() -> bool:
        answered = {f["in_reply_to"] for _, f in service.client.xrange("gm:outbound")}
        return set(ids) <= answered

    return check


def test_help() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "usage: bridge.py" in done.stdout
    assert "--state" in done.stdout and "docs/streams.md" in done.stdout


def test_each_message_gets_one_reply_across_a_restart_and_repeats_are_dropped(
    base: Path,
) -> None:
    state = base / "bridge-state.json"
    with LocalChatServer(delay_seconds=0.05) as llm:
        service = _start(base, llm)
        try:
            # Given a bridge next to the service, residents talking through it
            with bridge(service, state) as first:
                for n in range(6):
                    first.say(n, "im" if n % 2 else "public", f"hello {n}", avatar_name=f"Res {n}")
                until(lambda: len(first.posted()) == 6, "six messages posted")
                until(lambda: first.count() >= 6, "six replies shown")
                # When the service publishes a reply twice (at-least-once: a worker died
                # after publishing), here by hand
                repeated = dict(first.shown[0])
                service.client.xadd("gm:outbound", repeated)
                # and more residents speak, and the bridge is stopped mid-run (Ctrl-C)
                for n in range(6, 12):
                    first.say(n, "im", f"and then {n}")
                until(lambda: len(first.posted()) == 12, "twelve messages posted")
                first.stop()
            posted = first.posted()
            saved = json.loads(state.read_text())
            assert saved["recent"] == [r["in_reply_to"] for r in first.shown]
            # While it is down: the replies to what it posted arrive, and so do the
            # reply to a message it never posted (a resident of another bridge process
            # of the same grid) and the repeat, once more
            late = str(
                service.client.xadd(
                    "gm:inbound", {"avatar_uuid": avatar(20), "channel": "im", "text": "late"}
                )
            )
            until(_replied(service, [*posted, late]), "the replies while the bridge is down")
            service.client.xadd("gm:outbound", repeated)
            # Then a restart resumes where it stopped
            with bridge(service, state) as second:
                second.say(21, "public", "after the restart")
                until(lambda: len(second.posted()) == 1, "one more posted")
                everything = [*posted, late, *second.posted()]
                until(lambda: len(first.shown) + second.count() >= len(everything), "all shown")
                # one more round trip, so that anything it would show twice has come
                second.say(22, "im", "last one")
                until(lambda: len(second.posted()) == 2, "the last posted")
                everything.append(second.posted()[-1])
                until(lambda: len(first.shown) + second.count() >= len(everything), "the last")
                second.stop(signal.SIGTERM)
        finally:
            _stop(service)
    # the display names the bridge passed on reached the model, as each message's name
    named = {
        m["content"]: m.get("name")
        for body in llm.requests
        for m in body["messages"]
        if m["role"] == "user"
    }
    assert [named[f"hello {n}"] for n in range(6)] == [f"Res_{n}" for n in range(6)]
    shown = [r["in_reply_to"] for r in first.shown + second.shown]
    # every message answered and shown exactly once, both repeats dropped
    assert sorted(shown) == sorted(everything), (shown, everything)
    assert len(shown) == len(set(shown))
    assert sum("dropped a repeat" in line for line in first.said + second.said) == 2
    for reply in first.shown + second.shown:  # each reply names its resident and session
        assert reply["avatar_uuid"] in {avatar(n) for n in (*range(12), 20, 21, 22)}
        assert reply["text"] and reply["session_id"] and reply["channel"] in ("public", "im")
    # and the state file is whole, with no temporary file left beside it
    assert json.loads(state.read_text())["recent"][-1] == shown[-1]
    assert [p.name for p in base.iterdir() if p.name.startswith(".bridge-state")] == []
