"""The `gridmem` command: `serve` runs the service, `demo` shows it working.

What stops a command from starting is said here, in one line, with an exit status:
2 when a setting must change (the message names it), 1 for a fault at run time
(a server that does not answer). FAILURES is the one table that maps exception
types to both; the code below it raises, and this boundary explains.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import NamedTuple

import redis
from pydantic import ValidationError

from gridmem import __version__
from gridmem.errors import ConfigError
from gridmem.errors import GridmemError
from gridmem.partitions import MAX_PARTITIONS

if TYPE_CHECKING:
    from gridmem.config import Settings

CONFIG_EXIT = 2
FAULT_EXIT = 1
# The demo runs on the default limits: a resident opens at most two sessions (one per
# channel), so this many fit max_active_sessions (10,000) with no eviction. A typo with
# extra zeros used to be taken as asked, and filled the memory before the first message.
DEMO_MAX_RESIDENTS = 5_000


def _whole(least: int | None = None, most: int | None = None) -> Callable[[str], int]:
    """An argparse type for a whole number in [least, most], refused in words (argparse
    said `invalid _positive value: 'abc'`)."""

    def parse(text: str) -> int:
        try:
            digits = text.strip()
            # ASCII digits only, as everywhere else (int() reads Arabic-Indic digits too)
            if not digits.removeprefix("-").isascii():
                raise ValueError(text)
            value = int(digits, 10)
        except ValueError:
            what = "a positive whole number" if least == 1 else "a whole number"
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if least is not None and value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {text!r}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gridmem",
        description="Bounded, isolated conversation memory for LLM agents in virtual worlds.",
    )
    parser.add_argument("--version", action="version", version=f"gridmem {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the worker service (supervisor + worker processes)",
        description="Start the store (a private Valkey unless [redis] url is set), restore the "
        "newest snapshot if persistence is on, and run [worker] processes workers that answer "
        "the inbound stream. SIGTERM/SIGINT stops gracefully; a second signal stops the "
        "workers at once (the last snapshot is still written). Persistence is off by "
        "default: with the private Valkey, a stop then ends every conversation and the "
        "messages not yet answered (the stop says how many); set [conversation] "
        "persistence_enabled = true (GRIDMEM_CONVERSATION__PERSISTENCE_ENABLED=true) to keep "
        "them across a restart. Settings come from --config, then GRIDMEM_* environment variables "
        "(GRIDMEM_REDIS__URL, GRIDMEM_LLM__BASE_URL, ...). "
        "Exit status: 0 stopped, 1 a fault at run time (Redis not answering), "
        "2 a setting to change (named in the one-line message).",
    )
    serve.add_argument("--config", type=Path, help="TOML settings file (see gridmem.example.toml)")

    demo = commands.add_parser(
        "demo",
        help="the whole service with scripted residents; prints a report",
        description="Start a private Valkey, a worker pool and a local offline-responder "
        "endpoint; scripted residents talk on both channels (some pasting secrets, some going "
        "idle past the TTL on a fast clock). Prints turns, latency, sessions and bytes against "
        "limits, events, redactions and isolation/secret checks; exits 1 if a check fails.",
    )
    demo.add_argument(
        "--residents",
        type=_whole(least=1, most=DEMO_MAX_RESIDENTS),
        default=1500,
        help=f"1 to {DEMO_MAX_RESIDENTS} (default: 1500)",
    )
    demo.add_argument(
        "--processes",
        type=_whole(least=1, most=64),  # WorkerSettings.processes' bound
        default=2,
        help="worker processes (default: 2)",
    )
    demo.add_argument("--seed", type=_whole(), default=7, help="random seed (default: 7)")
    demo.add_argument(
        "--partitions",
        type=_whole(least=1, most=MAX_PARTITIONS),
        default=2,
        help="stream partitions, as [conversation] partitions (default: 2; docs/streams.md)",
    )

    check = commands.add_parser(
        "cluster-check",
        help="slot coverage of a Valkey/Redis Cluster and each primary's share of sessions",
        description="Ask one node of the cluster ([redis] url, GRIDMEM_REDIS__URL, or --url) "
        "for its view (CLUSTER NODES) and print: whether all 16,384 hash slots are served, "
        "by which primaries (slot ranges, replicas, state), and how many of the store's "
        "sessions each primary holds (each shard's session index, counted on the primary "
        "that owns the slot of the shard's hash tag; namespace and shards from "
        "[conversation]). Exit status: 0 every slot served and every primary answered, "
        "1 a slot no primary serves (its keys can be neither read nor written), a failed "
        "primary, or a server not answering, 2 a setting to change (no URL, a URL of a "
        "single server). Read-only: it sends CLUSTER INFO, CLUSTER NODES and ZCARD.",
    )
    check.add_argument("--config", type=Path, help="TOML settings file (see gridmem.example.toml)")
    check.add_argument(
        "--url",
        help="a node of the cluster, redis://[user:password@]host:port (default: [redis] url)",
    )
    check.add_argument(
        "--by-shard",
        action="store_true",
        help="also list each shard: its key prefix, the slot of its hash tag, the primary "
        "serving it and its sessions (which slots to move when resharding)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args.config)
    if args.command == "demo":
        return _demo(args)
    if args.command == "cluster-check":
        return _cluster_check(args.config, args.url, by_shard=args.by_shard)
    parser.print_help()
    return 2


def _serve(config: Path | None) -> int:
    from gridmem.config import Settings
    from worker.supervisor import Supervisor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings: Settings | None = None
    try:
        settings = Settings.load(config)
        return Supervisor(settings).run()
    except Exception as exc:
        return _explain("gridmem serve", exc, settings)


def _demo(args: argparse.Namespace) -> int:
    from gridmem.config import Settings
    from gridmem.config import unknown_environment
    from worker.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    settings: Settings | None = None
    try:
        # GRIDMEM_* variables reach the demo's settings too: a bad one is refused here,
        # before anything starts, and an unknown one is warned about as serve does
        settings = Settings()
        for warning in unknown_environment(os.environ, settings):
            logging.getLogger("gridmem.config").warning("%s", warning)
        report = run_demo(
            residents=args.residents,
            processes=args.processes,
            seed=args.seed,
            partitions=args.partitions,
        )
    except Exception as exc:
        return _explain("gridmem demo", exc, settings)
    return 1 if report.failures else 0


def _cluster_check(config: Path | None, url: str | None, *, by_shard: bool) -> int:
    from gridmem.config import RedisSettings
    from gridmem.config import Settings
    from gridmem.keys import KeySpace
    from worker.cluster_check import run

    settings: Settings | None = None
    try:
        settings = Settings.load(config)
        if url is not None:  # checked as the setting is, and named in its messages
            settings = settings.model_copy(update={"redis": RedisSettings(url=url)})
        if settings.redis.url is None:
            raise ConfigError(
                "cluster-check needs a node of the cluster: set [redis] url "
                "(GRIDMEM_REDIS__URL) or pass --url; the private Valkey is a single server"
            )
        conversation = settings.conversation
        keys = KeySpace(conversation.namespace, conversation.shards)
        status, report = run(settings.redis.url, keys, by_shard=by_shard)
    except Exception as exc:
        return _explain("gridmem cluster-check", exc, settings)
    print(report)
    return status


# -- what went wrong, in one line ------------------------------------------------------------


class Failure(NamedTuple):
    """How one kind of exception is told: the exit status, and the words after the command."""

    types: tuple[type[BaseException], ...]
    status: int
    say: Callable[[BaseException, Where], str]
    # a narrower test than the type, where one type covers settings and faults both
    when: Callable[[BaseException, Where], bool] = lambda exc, where: True


class Where(NamedTuple):
    """What the message names: the Redis the settings point at, and the storage path."""

    redis_url: str | None  # None: the private Valkey under storage_path
    storage_path: Path | None

    def redis(self) -> str:
        from gridmem.config import redacted_url

        if self.redis_url is None:
            return f"the private Valkey under storage_path {self.storage_path}"
        return f"Redis at {redacted_url(self.redis_url)} (redis.url, GRIDMEM_REDIS__URL)"


def _path_problem(exc: BaseException, where: Where) -> str:
    assert isinstance(exc, OSError)
    if exc.filename is None:
        return str(exc)
    what = f"{exc.strerror or exc}: {exc.filename}"
    if _under_storage(exc, where):
        return (
            f"storage_path {where.storage_path} (GRIDMEM_STORAGE_PATH) cannot be used: {what}; "
            "choose a directory gridmem may create and write"
        )
    return f"cannot use {what}"


def _under_storage(exc: BaseException, where: Where) -> bool:
    """Whether an OSError is about storage_path: the path, a path inside it, or a parent."""
    if not isinstance(exc, OSError) or exc.filename is None or where.storage_path is None:
        return False
    failed = Path(str(exc.filename)).absolute()
    storage = where.storage_path.absolute()
    return failed == storage or storage in failed.parents or failed in storage.parents


# First match wins: a subclass before its base (AuthenticationError is a ConnectionError,
# an EmbeddedServerError a GridmemError). Anything not here is a bug: its traceback stays.
FAILURES: list[Failure] = [
    Failure((ConfigError,), CONFIG_EXIT, lambda exc, where: str(exc)),
    # storage_path under /proc, below a file, not writable: a setting; another OS fault
    # (a missing binary, a port in use) is not
    Failure((OSError,), CONFIG_EXIT, _path_problem, when=_under_storage),
    Failure((OSError,), FAULT_EXIT, _path_problem),
    Failure(
        (ValidationError,),
        CONFIG_EXIT,
        lambda exc, where: str(_config_error(exc)),
    ),
    Failure(
        (redis.AuthenticationError, redis.exceptions.NoPermissionError),
        CONFIG_EXIT,
        lambda exc, where: f"{where.redis()} refused the credentials: {exc}",
    ),
    Failure(
        (redis.ConnectionError, redis.TimeoutError),
        FAULT_EXIT,
        lambda exc, where: f"cannot reach {where.redis()}: {exc}",
    ),
    Failure(
        (redis.RedisError,),
        FAULT_EXIT,
        lambda exc, where: f"{where.redis()} answered with an error: {exc}",
    ),
    Failure((GridmemError,), FAULT_EXIT, lambda exc, where: str(exc)),
]


def _config_error(exc: BaseException) -> ConfigError:
    from gridmem.config import config_error

    assert isinstance(exc, ValidationError)
    return config_error(exc)


def failure(exc: BaseException, where: Where) -> tuple[int, str] | None:
    """(exit status, message) for an exception a person can act on; None for a bug."""
    for entry in FAILURES:
        if isinstance(exc, entry.types) and entry.when(exc, where):
            return entry.status, entry.say(exc, where)
    return None


def _explain(command: str, exc: Exception, settings: Settings | None) -> int:
    """Say what stopped `command` in one line on stderr; return its exit status."""
    where = Where(
        settings.redis.url if settings else None,
        settings.storage_path if settings else None,
    )
    told = failure(exc, where)
    if told is None:
        raise exc
    status, message = told
    print(f"{command}: {message}".replace("\n", " "), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
