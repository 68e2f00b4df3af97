"""One private Valkey per storage_path, shared by every local process (issue 13, item 3).

`gridmem serve` and each library user of `from_config` attach to the server under
storage_path, whoever started it; it stops when the last of them closes or exits,
SIGKILL included. These tests run the processes a person would run and read the
process table (psutil), not only return values.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem import Settings
from gridmem.store import AsyncConversationStore
from tests.helpers import avatar
from tests.test_serve_defaults import DEADLINE
from tests.test_serve_defaults import ROOT
from tests.test_serve_defaults import _answered
from tests.test_serve_defaults import _ctrl_c
from tests.test_serve_defaults import _serve
from tests.test_serve_defaults import _servers
from tests.test_serve_defaults import _until
from tests.test_serve_defaults import empty

pytestmark = [pytest.mark.real, pytest.mark.slow]
__all__ = ["empty"]  # the fixture, shared with test_serve_defaults


def _config(directory: Path) -> Path:
    """The README's set-up: the example config as gridmem.toml, persistence on."""
    text = (ROOT / "gridmem.example.toml").read_text()
    config = directory / "gridmem.toml"
    config.write_text(text.replace("persistence_enabled = false", "persistence_enabled = true"))
    return config


class User:
    """A library user in a process of its own (tests/shared_user.py)."""

    def __init__(self, directory: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMEM_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.shared_user", str(_config(directory))],
            cwd=directory,
            env={**env, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._line() == "attached"

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line, f"the user exited with {self.process.wait(DEADLINE)}"
        return line

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._line()

    def context(self, uuid: str) -> list[str]:
        said: list[str] = json.loads(self.ask(f"context {uuid}"))
        return said

    def close(self) -> None:
        assert self.ask("close") == "closed"
        assert self.process.wait(DEADLINE) == 0
        self._release()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(DEADLINE)
        self._release()

    def _release(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def _valkeys(directory: Path) -> list[int]:
    return [p.pid for p in _servers(directory) if p.name().startswith("valkey")]


def test_a_service_and_two_library_users_share_one_server_and_leave_none(
    empty: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 13, item 3): each from_config with no Redis URL started its own
    server on the same socket path as a running `gridmem serve` (the service then
    answered no one) and never stopped it. Now the service and the library users
    share one server, which runs while any of them is attached, whichever started it,
    and stops with the last one."""
    # Given a library user that starts the server, and a service that joins it
    first = User(empty)
    first.ask(f"record {avatar(1)} from the first user")
    [server] = _valkeys(empty)
    process, client = _serve(empty, "--config", "gridmem.toml")
    second: User | None = None
    try:
        client.xadd("gm:inbound", {"avatar_uuid": avatar(2), "channel": "im", "text": "hi"})
        _until(_answered(client, 1), "the service's answer")
        # When a second library user attaches
        second = User(empty)
        # Then there is one server, and each sees what the others wrote
        assert _valkeys(empty) == [server] and second.ask("server") == str(server)
        assert second.context(avatar(1)) == ["from the first user"]
        assert second.context(avatar(2))[0] == "hi" and len(second.context(avatar(2))) == 2
        second.ask(f"record {avatar(3)} from the second user")
        assert first.context(avatar(3)) == ["from the second user"]
        # When the user that started it is killed outright, the server stays for the others
        first.kill()
        client.xadd("gm:inbound", {"avatar_uuid": avatar(4), "channel": "im", "text": "still?"})
        _until(_answered(client, 2), "an answer after the first user died")
        assert _valkeys(empty) == [server]
        # and when the service stops (Ctrl-C), it stays for the second user
        out = _ctrl_c(process)
        assert "left running for its other users" in out and "ERROR" not in out, out
        assert _valkeys(empty) == [server]
        assert second.context(avatar(4))[0] == "still?"
        # Then when the last user closes, the server is gone once close() returns
        second.close()
        second = None
        assert _valkeys(empty) == []
        _until(lambda: not _servers(empty), "no keeper left")
    finally:
        if process.returncode is None:
            _ctrl_c(process)
        client.close()
        for user in (first, second):
            if user is not None and user.process.returncode is None:
                user.kill()
    # And the conversations are in the last snapshot, back in the next server
    monkeypatch.chdir(empty)  # where the config's relative storage_path is
    with ConversationStore.from_config(Settings.load(_config(empty))) as store:
        assert [m.content for m in store.context(avatar(3), "im")] == ["from the second user"]
        assert [m.content for m in store.context(avatar(1), "im")] == ["from the first user"]
    assert not _valkeys(empty)


def _readme_snippet() -> str:
    """The README's from_config example ("Or build it from settings"), as written."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("Or build it from settings") :]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("closes", [True, False])
def test_the_readme_snippet_run_twice_leaves_no_server(empty: Path, closes: bool) -> None:
    """Regression (issue 13, item 3): two runs of the README's from_config snippet left
    two servers running. Now the server stops after each run: when the store is
    closed (the README's `with`), and when a process exits without close() (the
    kernel drops its lock)."""
    _config(empty)
    snippet = _readme_snippet()
    assert "from_config" in snippet and "with " in snippet
    if not closes:
        snippet = snippet.replace("with ConversationStore", "store = ConversationStore")
        snippet = snippet.split(" as store:")[0] + "\n"
    snippet += "print(open('gridmem-data/valkey/keeper.log').read().count('started'))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMEM_")}
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", snippet],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(run)  # each run started a server of its own
        _until(lambda: not _servers(empty), "the server to stop after the run")


def test_the_async_door_shares_the_server_with_the_sync_one(empty: Path) -> None:
    """Issue 13, item 3: AsyncConversationStore.from_config attaches to the same private
    server as ConversationStore.from_config; `async with` leaves it."""
    settings = Settings(storage_path=empty / "gridmem-data")

    async def scenario() -> list[str]:
        async with AsyncConversationStore.from_config(settings) as door:
            with ConversationStore.from_config(settings) as store:
                store.record(avatar(1), "im", AvatarMessage(text="sync wrote"))
            # the sync store left; the async one keeps the server up
            assert len(_valkeys(empty)) == 1
            return [m.content for m in await door.context(avatar(1), "im")]

    assert asyncio.run(scenario()) == ["sync wrote"]
    assert not _valkeys(empty)  # the last user's aclose() returned: the server is gone
    _until(lambda: not _servers(empty), "no keeper left")


def test_a_library_user_killed_alone_leaves_no_server(empty: Path) -> None:
    """Issue 13, item 3: SIGKILL of the only user (no close(), no atexit) stops the server."""
    user = User(empty)
    assert _valkeys(empty)
    user.kill()  # SIGKILL
    _until(lambda: not _servers(empty), "the server to stop after its only user died")


def test_a_closed_store_refuses_calls_while_the_server_runs_for_others(empty: Path) -> None:
    """Regression (issue 13, found by trying it): a store used after its `with` block
    (or close()) went on working while another user kept the private server up,
    though it no longer counted as a user; once the others left, the server stopped
    under it and its next call failed as `ConnectionError: Error 2 connecting to
    .../valkey.sock`. Now a closed store refuses every call, on both doors, before
    a command is sent, like a closed file."""
    from gridmem.errors import GridmemError
    from gridmem.errors import StoreClosed

    settings = Settings(storage_path=empty / "gridmem-data")
    # Given another user keeping the server up, and a store that was used and closed
    with ConversationStore.from_config(settings) as other:
        with ConversationStore.from_config(settings) as store:
            store.record(avatar(1), "im", AvatarMessage(text="inside"))
        # When it is used after its with block, Then it refuses (a GridmemError too)
        for call in (
            lambda: store.record(avatar(1), "im", AvatarMessage(text="after")),
            lambda: store.context(avatar(1), "im"),
        ):
            with pytest.raises(StoreClosed, match="closed"):
                call()
        assert issubclass(StoreClosed, GridmemError)
        store.close()  # closing again does nothing
        # And nothing it was asked after close reached the server
        assert [m.content for m in other.context(avatar(1), "im")] == ["inside"]

        async def async_door() -> None:
            door = AsyncConversationStore.from_config(settings)
            await door.aclose()
            with pytest.raises(StoreClosed):
                await door.record(avatar(2), "im", AvatarMessage(text="after"))

        asyncio.run(async_door())
        assert other.list_metadata().items[0].avatar_uuid == avatar(1)
    _until(lambda: not _servers(empty), "no server or keeper left")
