"""`gridmem serve` as a newcomer runs it: no config file, an empty directory, Ctrl-C.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the
supervisor, its workers and, before the fix, the private Valkey too. The test
starts the service in its own process group and signals the group, as a
terminal does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis as redis_py

from tests.conftest import short_tempdir
from tests.helpers import avatar

pytestmark = [pytest.mark.real, pytest.mark.slow]

DEADLINE = 60.0


@pytest.fixture
def empty() -> Iterator[Path]:
    path = short_tempdir("gm-new-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _serve(directory: Path, **overrides: str) -> tuple[subprocess.Popen[bytes], redis_py.Redis]:
    """`gridmem serve`, no arguments, in `directory`; persistence on through the
    environment (the documented GRIDMEM_* override), everything else default."""
    env = {**os.environ, "GRIDMEM_CONVERSATION__PERSISTENCE_ENABLED": "true", **overrides}
    env.pop("GRIDMEM_REDIS__URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve"],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group of its own, as a terminal's job is
    )
    client = redis_py.Redis(
        unix_socket_path=str(directory / "gridmem-data" / "valkey" / "valkey.sock"),
        decode_responses=True,
    )
    deadline = time.monotonic() + DEADLINE
    while True:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise AssertionError(f"gridmem serve exited with {process.returncode}:\n{output}")
        with contextlib.suppress(
            redis_py.ConnectionError, redis_py.ResponseError, OSError, psutil.Error
        ):
            # up: this service's own server (not one an earlier service left running),
            # and both default workers read the stream (their stop handlers are set)
            ours = {child.pid for child in psutil.Process(process.pid).children()}
            if int(client.info("server")["process_id"]) in ours and (
                len(client.xinfo_consumers("gm:inbound", "workers")) >= 2
            ):
                return process, client
        if time.monotonic() > deadline:
            _ctrl_c(process)  # leave nothing running behind a failed test
            raise AssertionError("gridmem serve did not start")
        time.sleep(0.05)  # polling another process's readiness, with a deadline


def _ctrl_c(process: subprocess.Popen[bytes], presses: int = 1) -> str:
    """Ctrl-C in the terminal, once or twice (the second once the first is handled)."""
    os.killpg(process.pid, signal.SIGINT)
    seen: list[str] = []
    if presses == 2:
        assert process.stdout is not None
        for line in process.stdout:  # the supervisor logs the signal it got
            seen.append(line.decode())
            if "signal 2: stopping" in seen[-1]:
                break
        os.killpg(process.pid, signal.SIGINT)
    out, _ = process.communicate(timeout=DEADLINE)
    said = "".join(seen) + out.decode()
    assert process.returncode == 0, said
    return said


@pytest.mark.parametrize("presses", [1, 2])
def test_serve_with_defaults_in_an_empty_directory_then_ctrl_c_keeps_the_conversations(
    empty: Path, presses: int
) -> None:
    """Regressions (issue 12, second pass, as a newcomer): with the default relative
    storage_path, the private Valkey could not start (it runs in its --dir, where the
    relative socket and log paths do not exist); Ctrl-C reached the Valkey too, so the
    last snapshot failed ("flush failed") and the conversations were lost; and an
    impatient second Ctrl-C skipped the last snapshot altogether."""
    # Given `gridmem serve` with defaults in an empty directory, answering residents
    process, client = _serve(empty)
    try:
        sent = [
            client.xadd(
                "gm:inbound", {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
            )
            for n in range(5)
        ]
        _until(lambda: client.xlen("gm:outbound") >= len(sent), "every message answered")
    finally:
        # When the operator presses Ctrl-C (once, or twice)
        out = _ctrl_c(process, presses)
        client.close()
    # Then the service stops cleanly and writes its last snapshot
    assert "flush failed" not in out and "ERROR" not in out, out
    assert ("stopping now" in out) == (presses == 2), out
    assert list((empty / "gridmem-data" / "conversations").glob("*.snap")), out
    # And a restart in the same directory has every conversation back
    process, client = _serve(empty)
    try:
        from worker import ConversationConfig, ConversationStore

        store = ConversationStore(client, ConversationConfig())
        for n in range(5):
            said = [m.content for m in store.context(avatar(n), "im")]
            assert said[0] == f"hi {n}" and len(said) == 2
    finally:
        out = _ctrl_c(process)
        client.close()
    assert 'sessions_restored":5' in out.replace(" ", ""), out


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling other processes, with a deadline


def _answered(client: redis_py.Redis, n: int) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(redis_py.ConnectionError, OSError):
            return int(client.xlen("gm:outbound")) >= n
        return False

    return check


def test_the_private_valkey_is_started_again_when_it_dies_with_the_conversations(
    empty: Path,
) -> None:
    """Regression (issue 12, second pass, a Redis restart): nothing watched the private
    Valkey; killed (the OOM killer), it stayed dead, the workers retried forever and no
    one was answered until an operator restarted the service. Now the supervisor starts
    it again, restores the newest snapshot into it, and the workers go on."""
    process, client = _serve(empty, GRIDMEM_CONVERSATION__FLUSH_INTERVAL_SECONDS="0.2")
    snaps = empty / "gridmem-data" / "conversations"
    try:
        # Given conversations answered and in a snapshot
        for n in range(3):
            client.xadd(
                "gm:inbound", {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
            )
        _until(_answered(client, 3), "the answers")
        flushed = len(list(snaps.glob("*.snap")))
        _until(lambda: len(list(snaps.glob("*.snap"))) >= flushed + 2, "a snapshot after them")
        # When the private Valkey is killed
        [server] = [
            child
            for child in psutil.Process(process.pid).children(recursive=True)
            if "valkey" in child.name()
        ]
        server.kill()

        # Then it is started again with the conversations, and a new message is answered
        def answered_again() -> bool:
            with contextlib.suppress(redis_py.ConnectionError, redis_py.ResponseError, OSError):
                client.xadd(
                    "gm:inbound", {"avatar_uuid": avatar(0), "channel": "im", "text": "back?"}
                )
                return True
            return False

        _until(answered_again, "the server to be back")
        _until(_answered(client, 1), "an answer after the restart")
        from worker import ConversationConfig, ConversationStore

        said = [
            m.content
            for m in ConversationStore(client, ConversationConfig()).context(avatar(0), "im")
        ]
        assert said[0] == "hi 0" and said[2] == "back?", said
    finally:
        out = _ctrl_c(process)
        client.close()
    assert "private Valkey exited with -9; starting it again" in out, out


def test_a_second_serve_in_the_same_directory_refuses_to_start(empty: Path) -> None:
    """Regression (issue 12, second pass, a careless operator): a second `gridmem serve`
    in the same directory started a second private Valkey on the same socket path,
    cutting the first server off with its conversations in memory. Now it refuses,
    saying which process holds the directory, and the first one goes on."""
    process, client = _serve(empty)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "worker", "serve"],
            cwd=empty,
            capture_output=True,
            timeout=DEADLINE,
            check=False,
        )
        assert second.returncode == 1
        said = second.stderr.decode()
        assert f"another gridmem serve (pid {process.pid}) is running" in said, said
        # the first is untouched: still answering on its own server
        client.xadd("gm:inbound", {"avatar_uuid": avatar(1), "channel": "im", "text": "hi"})
        _until(_answered(client, 1), "the first service's answer")
    finally:
        _ctrl_c(process)
        client.close()


@pytest.mark.parametrize(
    ("env", "said", "status"),
    [
        (
            {"GRIDMEM_REDIS__URL": "redis://:hunter2-secret@127.0.0.1:1/0"},
            "gridmem serve: cannot reach Redis at redis://:***@127.0.0.1:1/0",
            1,
        ),
        (
            {"GRIDMEM_STORAGE_PATH": "/proc/gridmem-nope"},
            "gridmem serve: storage_path /proc/gridmem-nope",
            2,  # a setting to change (issue 13 item 4)
        ),
    ],
)
def test_serve_that_cannot_start_says_why_in_one_line(
    empty: Path, env: dict[str, str], said: str, status: int
) -> None:
    """Regression (issue 12, second pass, a careless operator): an unreachable Redis or an
    unusable storage_path ended `gridmem serve` with a traceback from deep in redis-py
    or pathlib. Now: one line that names the problem, never the URL's password, and
    exit status 1 for a fault, 2 for a setting (tests/test_cli_errors.py has them all)."""
    result = subprocess.run(
        [sys.executable, "-m", "worker", "serve"],
        cwd=empty,
        env={**os.environ, **env},
        capture_output=True,
        timeout=DEADLINE,
        check=False,
    )
    out = (result.stdout + result.stderr).decode()
    assert result.returncode == status, out
    assert said in out and "Traceback" not in out and "hunter2" not in out, out


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
def test_a_serve_killed_or_hung_up_loses_no_conversation_and_leaves_no_server(
    empty: Path, how: str
) -> None:
    """Regressions (issue 12, second pass, a careless operator): `kill -9` of the service
    (or the OOM killer) left its private Valkey running, holding the conversations
    since the last snapshot; the next `gridmem serve` took its socket path and
    restored the older snapshot, and the old server ran on, unreachable. Now the next
    start saves the old server's conversations and stops it. Closing the terminal
    (SIGHUP) killed the supervisor with no last snapshot; now it stops as on Ctrl-C."""
    process, client = _serve(empty)  # snapshots only at stop: the default interval is 60 s
    try:
        for n in range(3):
            client.xadd(
                "gm:inbound", {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
            )
        _until(_answered(client, 3), "the answers")
        [server] = [c for c in psutil.Process(process.pid).children() if "valkey" in c.name()]
        # When the service is killed (its whole process group, as `kill -9 -<pgid>` or a
        # closed terminal would signal it)
        os.killpg(process.pid, getattr(signal, how))
        process.wait(timeout=DEADLINE)  # not its output: a server left running holds stderr
    finally:
        if process.stdout is not None:
            process.stdout.close()
        client.close()
    # Then a new `gridmem serve` in the same directory has every conversation
    process, client = _serve(empty)
    try:
        from worker import ConversationConfig, ConversationStore

        store = ConversationStore(client, ConversationConfig())
        for n in range(3):
            said = [m.content for m in store.context(avatar(n), "im")]
            assert said[:1] == [f"hi {n}"] and len(said) == 2, said
        # and the old server is gone (no longer answering: exited, or a zombie to reap)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, (
            server.status(),
            server.pid,
            [c.pid for c in psutil.Process(process.pid).children()],
        )
    finally:
        out = _ctrl_c(process)
        client.close()
    # (killed: the next start saved the old server's conversations; hung up: the
    # service stopped as on Ctrl-C, with its last snapshot, and left no server behind)
    left = "a private Valkey left by an earlier gridmem serve answers" in out
    assert left == (how == "SIGKILL"), out
