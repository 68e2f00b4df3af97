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
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis as redis_py

from gridmem import ConversationStore
from gridmem import Settings
from tests.conftest import short_tempdir
from tests.helpers import avatar
from worker.localllm import LocalChatServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

DEADLINE = 60.0
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def empty() -> Iterator[Path]:
    path = short_tempdir("gm-new-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _serve(
    directory: Path, *args: str, **overrides: str
) -> tuple[subprocess.Popen[bytes], redis_py.Redis]:
    """`gridmem serve [args]` in `directory`; persistence on through the environment
    (the documented GRIDMEM_* override), everything else default."""
    env = {**os.environ, "GRIDMEM_CONVERSATION__PERSISTENCE_ENABLED": "true", **overrides}
    env.pop("GRIDMEM_REDIS__URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve", *args],
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
            # up: both default workers of this service read the stream (their stop
            # handlers are set); consumers of an earlier service's workers do not count
            ours = {str(child.pid) for child in psutil.Process(process.pid).children()}
            consumers = client.xinfo_consumers("gm:inbound", "workers")
            if len([c for c in consumers if c["name"].rsplit("-", 1)[-1] in ours]) >= 2:
                return process, client
        if time.monotonic() > deadline:
            _ctrl_c(process)  # leave nothing running behind a failed test
            raise AssertionError("gridmem serve did not start")
        time.sleep(0.05)  # polling another process's readiness, with a deadline


def _servers(directory: Path) -> list[psutil.Process]:
    """The valkey-server and keeper processes of `directory`'s storage_path, by their
    command lines (a valkey-server shows its socket there)."""
    data = str(directory / "gridmem-data" / "valkey")
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if process.info["status"] != psutil.STATUS_ZOMBIE and data in " ".join(
                process.info["cmdline"] or []
            ):
                found.append(process)
    return found


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
        from gridmem import ConversationConfig
        from gridmem import ConversationStore

        store = ConversationStore(client, ConversationConfig())
        for n in range(5):
            said = [m.content for m in store.context(avatar(n), "im")]
            assert said[0] == f"hi {n}" and len(said) == 2
    finally:
        out = _ctrl_c(process)
        client.close()
    assert 'sessions_restored":5' in out.replace(" ", ""), out


def test_serve_with_the_example_config_in_an_empty_directory_answers(empty: Path) -> None:
    """Regression (issue 13, item 1, as a newcomer): `cp gridmem.example.toml gridmem.toml
    && gridmem serve --config gridmem.toml` ended in a traceback (the relative
    storage_path reached the private Valkey relative). Now it answers."""
    # Given the example config copied into an empty directory, as the README says
    shutil.copy(ROOT / "gridmem.example.toml", empty / "gridmem.toml")
    process, client = _serve(empty, "--config", "gridmem.toml")
    try:
        # When a resident speaks on the inbound stream
        sent = client.xadd("gm:inbound", {"avatar_uuid": avatar(1), "channel": "im", "text": "hi"})
        _until(_answered(client, 1), "the answer")
        # Then the reply on the outbound stream answers that message
        [reply] = _replies(client)
        assert reply["in_reply_to"] == sent and reply["avatar_uuid"] == avatar(1), reply
    finally:
        out = _ctrl_c(process)
        client.close()
    assert "Traceback" not in out and "ERROR" not in out, out
    assert (empty / "gridmem-data" / "valkey" / "valkey.log").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_with_messages_in_flight_answers_each_exactly_once_across_a_restart(
    empty: Path, sig: signal.Signals
) -> None:
    """Regression (issue 13, item 2): Ctrl-C signals the whole foreground process group
    (SIGINT; a service manager's stop may send SIGTERM to the whole group);
    the private Valkey in it died first, so the workers could not write the replies
    in hand and the last snapshot failed. Now the server (its keeper in a session of
    its own) outlives the workers and the flush: every message in a worker's hand is
    answered before the stop, the rest after the restart, each exactly once, and the
    conversations come back from the snapshot. A bridge attached through the library
    (from_config) keeps the server, and the streams in it, up across the restart."""
    settings = Settings(
        storage_path=empty / "gridmem-data", conversation={"persistence_enabled": True}
    )
    slow = {
        "GRIDMEM_LLM__BASE_URL": "",  # set below: a model that thinks for a while
        "GRIDMEM_WORKER__CONCURRENCY": "2",  # 2 processes x 2: four in hand, the rest wait
    }
    with LocalChatServer(delay_seconds=1.0) as llm:
        slow["GRIDMEM_LLM__BASE_URL"] = llm.url
        # Given the service running, and a bridge attached to its private server
        process, client = _serve(empty, **slow)
        bridge = ConversationStore.from_config(settings)
        try:
            posted = [
                client.xadd(
                    "gm:inbound", {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
                )
                for n in range(10)
            ]
            # When Ctrl-C reaches the whole process group with four messages in hand
            _until(lambda: len(llm.requests) >= 4, "four messages in the workers' hands")
            os.killpg(process.pid, sig)
            out, _ = process.communicate(timeout=DEADLINE)
            first = out.decode()
            assert process.returncode == 0, first
            # Then the service stopped cleanly: the server outlived workers and flush
            for bad in ("ERROR", "unreachable", "flush failed", "Traceback"):
                assert bad not in first, first
            assert "snapshot generation" in first and "left running" in first, first
            answered = len(_replies(client))
            assert 4 <= answered < 10, first  # those in hand, not those waiting
            assert client.xpending("gm:inbound", "workers")["pending"] == 0  # all acked
            # And after a restart the waiting ones are answered, none twice
            process, client = _serve(empty, **slow)
            _until(_answered(client, 10), "every message answered")
            replies = [fields["in_reply_to"] for fields in _replies(client)]
        finally:
            _ctrl_c(process)
            client.close()
            bridge.close()  # the last user: the server saves and stops
    assert sorted(replies) == sorted(posted), (replies, posted)
    _until(lambda: not _servers(empty), "no server or keeper left")
    # And the conversations are back from the snapshot in a new server
    with ConversationStore.from_config(settings) as store:
        for n in range(10):
            said = [m.content for m in store.context(avatar(n), "im")]
            assert said[0] == f"hi {n}" and len(said) == 2, said
    _until(lambda: not _servers(empty), "no server or keeper left")


def test_ctrl_c_with_no_other_user_says_how_many_messages_end_unanswered(empty: Path) -> None:
    """Regression (issue 13, found by trying it): with no library user attached (a
    bridge over plain redis-py, as examples/bridge.py is), Ctrl-C stopped the private
    Valkey, and with it every inbound message still waiting, without a word: the log
    said a clean stop, the restart had the sessions back and 272 of 405 messages
    were never answered. With persistence off the private server keeps the streams in
    memory only; the stop now says how many messages it leaves unanswered."""
    slow = {
        "GRIDMEM_LLM__BASE_URL": "",
        "GRIDMEM_WORKER__CONCURRENCY": "1",
        "GRIDMEM_CONVERSATION__PERSISTENCE_ENABLED": "false",
    }
    with LocalChatServer(delay_seconds=1.0) as llm:
        slow["GRIDMEM_LLM__BASE_URL"] = llm.url
        # Given the service alone on its private server, ten messages waiting
        process, client = _serve(empty, **slow)
        try:
            for n in range(10):
                client.xadd(
                    "gm:inbound", {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
                )
            _until(lambda: len(llm.requests) >= 1, "a message in a worker's hand")
        finally:
            # When Ctrl-C reaches the whole process group
            out = _ctrl_c(process)
            client.close()
    # Then the stop says how many it leaves unanswered: those the model never saw
    asked = len(llm.requests)  # each one in hand is finished (and answered) first
    assert "private Valkey stopped" in out, out
    assert f"WARNING {10 - asked} inbound messages were not answered and are lost" in out, out
    assert not (empty / "gridmem-data" / "conversations" / "backlog").exists()
    _until(lambda: not _servers(empty), "no server or keeper left")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_with_no_other_user_keeps_every_message_with_persistence_on(
    empty: Path, sig: signal.Signals
) -> None:
    """Issue 13, item 2: with persistence on and no library user attached, a stop of
    the whole process group lost the stream backlog with the private Valkey (it keeps
    the streams in memory; snapshots held the sessions only). Now the keeper saves
    the backlog as it stops the server and the next start adds it back: every message
    is answered exactly once across the stop and the start, and every reply published
    before the stop is still there for a bridge to read, at its ID."""
    slow = {"GRIDMEM_LLM__BASE_URL": "", "GRIDMEM_WORKER__CONCURRENCY": "1"}
    with LocalChatServer(delay_seconds=1.0) as llm:
        slow["GRIDMEM_LLM__BASE_URL"] = llm.url
        # Given the service alone on its private server, ten messages posted
        process, client = _serve(empty, **slow)
        try:
            posted = [
                client.xadd(
                    "gm:inbound",
                    {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"},
                )
                for n in range(10)
            ]
            # When the process group is signalled with two answered, more in hand
            _until(_answered(client, 2), "two messages answered")
            before = client.xrange("gm:outbound")
        finally:
            os.killpg(process.pid, sig)
            out = process.communicate(timeout=DEADLINE)[0].decode()
            client.close()
        assert process.returncode == 0, out
        assert "private Valkey stopped" in out, out
        assert "not answered and are lost" not in out, out
        _until(lambda: not _servers(empty), "the first server gone")
        backlog = empty / "gridmem-data" / "conversations" / "backlog"
        assert backlog.exists()
        # And the service starts again on a new private server
        process, client = _serve(empty, **slow)
        try:
            restored = not backlog.exists()  # added back, then deleted: never replayed twice
            _until(_answered(client, 10), "every message answered")
            after: Any = client.xrange("gm:outbound")
            waiting = client.xlen("gm:inbound")
        finally:
            restart = _ctrl_c(process)
            client.close()
    # Then each message is answered exactly once, across the stop and the start
    assert sorted(f["in_reply_to"] for _, f in after) == sorted(posted), (after, posted)
    assert waiting == 0
    # And no reply a bridge had not read yet is lost: each is there at its own ID
    kept = dict(after)
    for entry_id, fields in before:
        assert kept.get(entry_id) == fields, (entry_id, fields)
    assert "stream backlog restored" in restart, restart
    assert restored
    _until(lambda: not _servers(empty), "no server or keeper left")


def _replies(client: redis_py.Redis) -> list[dict[str, str]]:
    """The outbound stream's entries (the client decodes responses)."""
    entries: Any = client.xrange("gm:outbound")
    return [fields for _, fields in entries]


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
        [server] = [p for p in _servers(empty) if "valkey" in p.name()]
        server.kill()

        # Then it is started again with the conversations, and a new message is answered
        posted: list[str] = []

        def answered_again() -> bool:
            with contextlib.suppress(redis_py.ConnectionError, redis_py.ResponseError, OSError):
                posted.append(
                    client.xadd(
                        "gm:inbound", {"avatar_uuid": avatar(0), "channel": "im", "text": "back?"}
                    )
                )
                return True
            return False

        _until(answered_again, "the server to be back")
        # (the replies before it are back too, from the stream backlog of the last flush)
        _until(
            lambda: posted[0] in [f["in_reply_to"] for f in _replies(client)],
            "an answer after the restart",
        )
        from gridmem import ConversationConfig
        from gridmem import ConversationStore

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
        # said as every other start-up failure is: one line of its own, no log record
        assert said.splitlines() == [said.strip()] and said.startswith("gridmem serve: "), said
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


@pytest.mark.parametrize("how", ["SIGKILL", "SIGKILL-all", "SIGHUP"])
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
        [server] = [p for p in _servers(empty) if "valkey" in p.name()]
        # When the service is killed (its whole process group, as `kill -9 -<pgid>` or a
        # closed terminal would signal it; SIGKILL-all: the keeper of its server too)
        os.killpg(process.pid, getattr(signal, how.removesuffix("-all")))
        if how == "SIGKILL-all":
            [keeper] = [p for p in _servers(empty) if "keep_main" in " ".join(p.cmdline())]
            keeper.kill()
        process.wait(timeout=DEADLINE)  # not its output: a server left running holds stderr
    finally:
        if process.stdout is not None:
            process.stdout.close()
        client.close()
    # Then a new `gridmem serve` in the same directory has every conversation
    process, client = _serve(empty)
    try:
        from gridmem import ConversationConfig
        from gridmem import ConversationStore

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
    # (killed: the keeper saw its last user gone, saved the conversations and stopped
    # the server; killed with the keeper: the next start saved the orphan's
    # conversations; hung up: the service stopped as on Ctrl-C, with its last snapshot)
    left = "a private Valkey left by an earlier gridmem serve answers" in out
    assert left == (how == "SIGKILL-all"), out
    _until(lambda: not _servers(empty), "no server or keeper left")
