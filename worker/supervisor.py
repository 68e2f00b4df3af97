"""`gridmem serve`: start the store, N worker processes, and look after them.

The supervisor starts a private Valkey when no Redis URL is configured (Unix
socket under storage_path, directory 0700, persistence off), restores the
newest snapshot and the saved stream backlog (gridmem/backlog.py) when persistence
is on, creates the consumer group, and spawns
`worker.processes` workers (each builds its own Redis client after it starts).
It restarts a worker that dies, and the private Valkey if it dies (restoring the
newest snapshot into it), sweeps idle sessions and flushes snapshots on
their intervals, and stops gracefully on SIGTERM, SIGINT or SIGHUP (workers finish the
entry in hand, acknowledge it and exit; a last snapshot is flushed) and at
once on a second signal (workers killed; the last snapshot is still flushed).
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

from gridmem.config import Settings
from gridmem.config import endpoints
from gridmem.embedded import SharedValkey
from gridmem.errors import GridmemError
from gridmem.keys import KeySpace
from gridmem.store import ConversationStore
from gridmem.store import log_backlog_restored
from gridmem.store import open_store
from worker.service import GROUP
from worker.service import run_worker_process
from worker.service import settings_clock

log = logging.getLogger("gridmem.supervisor")

GRACEFUL_STOP_SECONDS = 30.0
RESTART_BACKOFF_MAX = 30.0


class StorageInUse(GridmemError):
    """Another `gridmem serve` holds this storage_path: a fault at run time (exit 1)."""


@dataclass
class Slot:
    """One worker process and its restart history."""

    process: BaseProcess | None = None
    restarts: list[float] = field(default_factory=list)
    not_before: float = 0.0


class Supervisor:
    """Runs the service until stop() (or a signal). Usable from a thread with signals off."""

    def __init__(self, settings: Settings, *, handle_signals: bool = True) -> None:
        self.settings = settings
        self.handle_signals = handle_signals
        self.url: str | None = settings.redis.url
        self.embedded: SharedValkey | None = None
        self.store: ConversationStore | None = None
        self.ready = threading.Event()  # set once the store is up and workers are started
        self._stop = threading.Event()
        self._now_stop = threading.Event()
        self._slots = [Slot() for _ in range(settings.worker.processes)]
        self._context = multiprocessing.get_context("spawn")
        self._metrics_dir: Path | None = None
        self._metrics_server: Any = None
        self._storage_lock: int | None = None
        self._store_restarts: list[float] = []
        self._store_not_before = 0.0

    def stop(self, *, immediately: bool = False) -> None:
        if self._stop.is_set() or immediately:
            self._now_stop.set()
        self._stop.set()

    def run(self) -> int:
        if self.handle_signals:
            # SIGHUP: the terminal or SSH session closed; stop as gracefully as on Ctrl-C
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, self._on_signal)
        try:
            if self.url is None:
                self._lock_storage()
            # what stops the start (an unusable storage_path, Redis not answering) is
            # raised to the caller: worker/cli.py says it in one line with an exit status
            self._start_store()
            log.info("%s", endpoints(self.settings, self.url or ""))
            self.ready.set()
            self._supervise()
        finally:
            self._shutdown()
            if self._storage_lock is not None:
                os.close(self._storage_lock)  # releases the lock
                self._storage_lock = None
        return 0

    def _lock_storage(self) -> None:
        """One service per storage_path when it holds the private Valkey.

        A second `gridmem serve` in the same directory used to start a second Valkey
        on the same socket path: the first server was cut off with its conversations
        in memory, and both supervisors flushed their own server's sessions into one
        snapshot directory in turn. Now the second one refuses to start. The lock
        (flock, released by the kernel when the process ends, however it ends) is
        held for the supervisor's lifetime; its file says which process holds it.
        """
        path = self.settings.storage_path
        # an unusable storage_path (under /proc, below a file) raises OSError naming
        # the path: the caller says it in one line (worker/cli.py)
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / "serve.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise StorageInUse(
                f"another gridmem serve (pid {holder}) is running with storage_path "
                f"{path.absolute()}; stop it first, or give this one its own storage_path"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._storage_lock = fd

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # act, then log: a second signal can run this handler again inside the first
        # one's logging call, and must find the first one's stop already made
        again = self._stop.is_set()
        self.stop()
        log.info("signal %s: %s", signum, "stopping now" if again else "stopping")

    # -- start --------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        """Metrics only when a port is set; the directory must exist before workers spawn."""
        port = self.settings.metrics.port
        if port is None:
            return
        from worker import metrics

        self._metrics_dir = self.settings.storage_path / "metrics"
        metrics.prepare_multiprocess_dir(self._metrics_dir)
        assert self.store is not None
        self._metrics_server = metrics.serve(port, self._metrics_dir, self.store.stats)
        log.info("metrics on http://127.0.0.1:%d/metrics", port)

    def _start_store(self) -> None:
        settings = self.settings
        if self.url is None:
            # shared with the library users of the same storage_path (SharedValkey)
            self.embedded = SharedValkey(settings.storage_path / "valkey", settings)
            self.url = self.embedded.url
        self.store = open_store(settings, self.url, clock=settings_clock(settings.worker))
        self._attach_or_prepare()
        self._start_metrics()
        for slot in self._slots:
            self._spawn(slot)

    def _attach_or_prepare(self) -> None:
        """The private Valkey: attach (a new server is prepared before any other user
        sees it); an external server: prepare it."""
        if self.embedded is None:
            self._prepare_store()
            return
        if self.embedded.attach(on_start=self._prepare_store):
            log.info("private Valkey started on %s", self.embedded.socket_path)
        else:
            # started by a library user of this storage_path: its restore ran (restore
            # runs once per server), the consumer group may not exist yet
            log.info("private Valkey already running on %s: sharing it", self.embedded.socket_path)
            self._prepare_store()

    def _prepare_store(self) -> None:
        """What a new server needs: the newest snapshot restored (persistence on), the
        consumer group, the published layout and limits. At start, and after the
        private Valkey was restarted."""
        assert self.store is not None
        if self.store.snapshots is not None:
            report = self.store.restore()
            log.info("restore: %s", report.model_dump_json(exclude={"quarantined"}))
            for bad in report.quarantined:
                log.warning("snapshot generation %d quarantined: %s", bad.generation, bad.cause)
            if self.embedded is not None:
                # the private Valkey's streams as its last stop (or flush) saved them;
                # before the consumer group, which starts at ID 0, so they are delivered
                try:
                    log_backlog_restored(self.store.restore_backlog())
                except Exception as exc:  # the file stays for the next start
                    log.error("restoring the stream backlog failed: %s", exc)
        conversation = self.settings.conversation
        space = KeySpace(conversation.namespace, conversation.shards, conversation.partitions)
        for service in space.services():
            self.store.executor.call(self.store.scripts.ensure_group(service, group=GROUP))
        self.store.publish_limits()

    def _revive_store(self) -> None:
        """The private Valkey died (OOM killer, a stray kill): start it again, restore the
        newest snapshot into it, and let the workers reconnect. Before, nothing watched
        it: the workers retried forever and the service answered no one until an
        operator restarted it. (An external server is the operator's to restart; the
        workers wait for it and recreate the consumer group.)"""
        embedded = self.embedded
        if embedded is None or self._stop.is_set():
            return
        status = embedded.returncode  # None while it runs, or when not attached
        if embedded.attached and status is None:
            return
        now = time.monotonic()
        if now < self._store_not_before:
            return
        if embedded.attached:
            log.error("private Valkey exited with %s; starting it again", status)
        else:  # the last try to start it again failed
            log.error("starting the private Valkey again")
        self._store_restarts = [t for t in self._store_restarts if now - t < 60] + [now]
        self._store_not_before = now + min(
            RESTART_BACKOFF_MAX, 0.5 * 2 ** (len(self._store_restarts) - 1)
        )
        embedded.detach()
        try:
            self._attach_or_prepare()
        except Exception as exc:  # keep supervising; try again after the backoff
            log.error("starting the private Valkey again failed: %s", exc)

    def _spawn(self, slot: Slot) -> None:
        assert self.url is not None
        data = self.settings.model_dump(mode="json")
        process = self._context.Process(
            target=run_worker_process, args=(data, self.url), daemon=False
        )
        process.start()
        slot.process = process
        log.info("worker process %s started", process.pid)

    # -- run --------------------------------------------------------------------------

    def _supervise(self) -> None:
        worker = self.settings.worker
        conversation = self.settings.conversation
        next_sweep = time.monotonic() + worker.sweep_interval_seconds
        next_flush = time.monotonic() + conversation.flush_interval_seconds
        while not self._stop.is_set():
            sentinels = [s.process.sentinel for s in self._slots if s.process is not None]
            multiprocessing.connection.wait(sentinels, timeout=0.5)
            self._revive_store()
            self._restart_dead()
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + worker.sweep_interval_seconds
                self._maintain("sweep")
            if conversation.persistence_enabled and now >= next_flush:
                next_flush = now + conversation.flush_interval_seconds
                self._maintain("flush")

    def _restart_dead(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if self._stop.is_set():
                return
            process = slot.process
            if process is not None and not process.is_alive():
                log.warning("worker process %s exited with %s", process.pid, process.exitcode)
                process.join()
                if self._metrics_dir is not None and process.pid is not None:
                    from worker.metrics import process_gone

                    process_gone(process.pid, self._metrics_dir)
                slot.process = None
                slot.restarts = [t for t in slot.restarts if now - t < 60] + [now]
                # crash-looping: wait longer before each new try
                slot.not_before = now + min(
                    RESTART_BACKOFF_MAX, 0.5 * 2 ** (len(slot.restarts) - 1)
                )
            if slot.process is None and now >= slot.not_before:
                self._spawn(slot)

    def _maintain(self, what: str) -> None:
        assert self.store is not None
        try:
            if what == "sweep":
                swept = self.store.sweep(limit=100_000)
                if swept:
                    log.info("swept %d idle sessions", swept)
            else:
                info = self.store.flush()
                if info is not None:
                    log.info("snapshot generation %d: %d sessions", info.generation, info.sessions)
                if self.embedded is not None and not self._stop.is_set():
                    # the private Valkey's streams, so a SIGKILL of it loses one
                    # interval at most; at a stop its keeper saves them as it stops
                    # it (gridmem.embedded.final_flush), after the workers are gone
                    saved = self.store.save_backlog()
                    if saved is not None:
                        log.debug(
                            "stream backlog: %d inbound, %d outbound", saved.inbound, saved.outbound
                        )
        except Exception as exc:  # keep supervising; say what failed
            log.error("%s failed: %s", what, exc)

    # -- stop --------------------------------------------------------------------------

    def _shutdown(self) -> None:
        processes = [s.process for s in self._slots if s.process is not None]
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACEFUL_STOP_SECONDS
        for process in processes:
            while (
                process.is_alive() and time.monotonic() < deadline and not self._now_stop.is_set()
            ):
                process.join(timeout=0.2)
            if process.is_alive():
                process.kill()
                process.join()
        backlog = 0
        if self.store is not None:
            # Even on a second signal: an impatient Ctrl-C Ctrl-C must not cost the
            # conversations since the last snapshot. The flush is one pass over the
            # live sessions; the workers, the slow part, are already gone.
            if self.settings.conversation.persistence_enabled:
                self._maintain("flush")
            backlog = self._backlog()  # last, so posts during the flush count too
            self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self._leave_store(backlog)

    def _backlog(self) -> int:
        """Inbound entries not answered yet (0 when it cannot be read: the server is
        gone already, or was never the private one, whose streams we do not keep)."""
        assert self.store is not None
        if self.embedded is None:
            return 0
        conversation = self.settings.conversation
        space = KeySpace(conversation.namespace, conversation.shards, conversation.partitions)
        try:
            return sum(
                self.store.executor.call(self.store.scripts.read_backlog(service))
                for service in space.services()
            )
        except Exception:  # the stop goes on; the count only feeds a warning
            return 0

    def _leave_store(self, backlog: int) -> None:
        """Last: the workers and the last snapshot needed the server. It stops once no
        library user of this storage_path is attached either.

        The private server keeps the streams in memory. With persistence on, its
        keeper saves their backlog to disk as it stops it (gridmem/backlog.py) and
        the next start adds it back. With persistence off, what was still waiting in
        gm:inbound, and the replies no bridge has read from gm:outbound, end with it:
        say so rather than lose them quietly."""
        if self.embedded is None or not self.embedded.attached:
            return
        if self.embedded.detach():
            log.info("private Valkey stopped")
            if backlog and not self.settings.conversation.persistence_enabled:
                log.warning(
                    "%d inbound messages were not answered and are lost with the private "
                    "Valkey (it keeps the streams in memory, and persistence is off). "
                    "Set [conversation] persistence_enabled = true to keep them across a "
                    "restart, keep a library user of this storage_path attached, "
                    "or set [redis] url to a server that persists",
                    backlog,
                )
        elif self.embedded.socket_path.exists():
            log.info("private Valkey left running for its other users")
