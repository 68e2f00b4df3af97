"""Worker processes that die (SIGKILL) in the middle of an entry, on a real server.

tests/crash_worker.py is the worker: it kills itself at a chosen step. This test
is its supervisor (it restarts the process each time it dies) and reads the
outcome from the streams, with a deadline, never on time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from gridmem.embedded import EmbeddedValkey
from tests.conftest import short_tempdir
from tests.helpers import avatar

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 120.0


class Crashing:
    """One crash_worker process at a time, restarted whenever it dies."""

    def __init__(self, url: str, mode: str, marker: Path) -> None:
        self.args = [sys.executable, "-m", "tests.crash_worker", url, mode, str(marker)]
        self.deaths: list[int] = []
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.args, cwd=ROOT)

    def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            try:
                code = self.process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            self.deaths.append(code)
            self.process = self._spawn()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def server(real_servers: dict[str, EmbeddedValkey]) -> Iterator[EmbeddedValkey]:
    real = real_servers["valkey"]
    with real.client() as client:
        client.flushall()
        client.function_flush()
    yield real


@pytest.fixture
def marker() -> Iterator[Path]:
    path = short_tempdir("gm-crash-")
    yield path / "crashed"
    shutil.rmtree(path, ignore_errors=True)


def _replies(client: redis_py.Redis) -> dict[str, dict[str, str]]:
    return {
        fields["in_reply_to"]: fields
        for _, fields in client.xrange("gm:outbound")  # type: ignore[union-attr]
    }


def _dead(client: redis_py.Redis) -> list[tuple[str, str]]:
    return [(f["id"], f["reason"]) for _, f in client.xrange("gm:dead")]  # type: ignore[union-attr]


def _send(client: redis_py.Redis, who: int, text: str | bytes) -> str:
    return str(
        client.xadd("gm:inbound", {"avatar_uuid": avatar(who), "channel": "im", "text": text})
    )


def test_a_process_killing_entry_is_dead_lettered_alone_and_bystanders_are_answered(
    server: EmbeddedValkey, marker: Path
) -> None:
    """Regression (issue 12, second pass): when a worker died holding several keys'
    entries, each held entry got an attempt counted; the entry that killed it three
    times also poisoned the innocent entries that happened to be in flight with it.
    Now an entry whose earlier attempt ended without a word runs alone in its worker:
    the bystanders are answered and only the culprit is dead-lettered `poison`."""
    client = redis_py.Redis.from_url(server.url, decode_responses=True)
    # Given a deadly entry and two innocent ones of other keys, all in flight together
    deadly = _send(client, 1, "this is DEADLY")
    bystanders = [_send(client, who, f"innocent {who}") for who in (2, 3)]
    crashing = Crashing(server.url, "llm", marker)
    try:
        # When the worker has died on it (and been restarted) as often as it takes
        crashing.until(lambda: len(crashing.deaths) >= 1, "the first crash")
        later = _send(client, 4, "after the crash")
        everything = [*bystanders, later]

        def settled() -> bool:  # each entry answered or dead-lettered, whichever it is
            done = set(_replies(client)) | {entry for entry, _ in _dead(client)}
            return {deadly, *everything} <= done

        crashing.until(settled, "every entry answered or dead-lettered")
    finally:
        crashing.stop()
    # Then only the culprit is dead-lettered, as poison, after max_attempts (3) deaths
    assert _dead(client) == [(deadly, "poison")], "innocent bystanders were poisoned"
    assert crashing.deaths == [-9, -9, -9]
    replies = _replies(client)
    assert deadly not in replies
    assert all(replies[b]["text"].startswith("answered: innocent") for b in bystanders)
    assert client.xlen("gm:inbound") == 0 and not client.exists("{gm:inbound}:attempts")
    client.close()


@pytest.mark.parametrize(
    ("mode", "fields", "reason"),
    [
        ("reject-before", {"text": b"caf\xe9"}, "bad_encoding"),
        ("reject-after", {"text": b"caf\xe9"}, "bad_encoding"),
        # no valid key: before, such an entry was filed nowhere, so a death before its
        # dead letter left it pending in the consumer group forever, never rejected
        ("reject-before", {"avatar_uuid": "not-a-uuid", "text": "x"}, "bad_uuid"),
        ("reject-before", {"channel": "group", "text": "x"}, "bad_channel"),
    ],
)
def test_a_worker_dying_while_it_rejects_an_entry_leaves_it_dead_lettered_with_its_reason(
    server: EmbeddedValkey, marker: Path, mode: str, fields: dict[str, Any], reason: str
) -> None:
    """Issue 12 item 2 (second pass): a worker killed after it decided to reject an
    entry (here bad_encoding) and before the dead letter landed (or before the entry
    was finished): the adopter dead-letters it with that reason, not `poison` (the
    crash made it look like a failed attempt, and with max_attempts = 1 it was
    poison), and the key's next message is answered."""
    client = redis_py.Redis.from_url(server.url, decode_responses=True)
    entry = {"avatar_uuid": avatar(1), "channel": "im", **fields}
    bad = str(client.xadd("gm:inbound", entry))
    crashing = Crashing(server.url, mode, marker)
    try:
        # (sent after the death: with max_attempts = 1, a message in flight in another
        # key when the worker died would rightly be poison)
        crashing.until(lambda: bool(crashing.deaths), "the worker's death")
        good = _send(client, 1, "next message")
        # an entry without a valid key waits under the reserved key, not behind `good`:
        # wait for both, whichever order they end in
        crashing.until(
            lambda: good in _replies(client) and bad in {e for e, _ in _dead(client)},
            "the next message's answer and the rejected entry's dead letter",
        )
    finally:
        crashing.stop()
    assert crashing.deaths == [-9] and marker.read_text() == mode
    dead = _dead(client)
    # at least once: a death after the dead letter landed repeats it, with the same reason
    assert set(dead) == {(bad, reason)}
    assert len(dead) == (1 if mode == "reject-before" else 2)
    assert bad not in _replies(client)
    assert client.xlen("gm:inbound") == 0 and not client.exists("{gm:inbound}:rejected")
    client.close()
