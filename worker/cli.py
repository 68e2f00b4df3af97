"""The `gridmem` command: `serve` runs the service, `demo` shows it working."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from worker import __version__
from worker.errors import ConfigError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


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
        "workers at once (the last snapshot is still written). "
        "Settings come from --config, then GRIDMEM_* environment variables "
        "(GRIDMEM_REDIS__URL, GRIDMEM_LLM__BASE_URL, ...).",
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
    demo.add_argument("--residents", type=_positive, default=1500, help="default: 1500")
    demo.add_argument(
        "--processes", type=_positive, default=2, help="worker processes (default: 2)"
    )
    demo.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args.config)
    if args.command == "demo":
        from worker.demo import run_demo

        logging.basicConfig(level=logging.WARNING)
        report = run_demo(residents=args.residents, processes=args.processes, seed=args.seed)
        return 1 if report.failures else 0
    parser.print_help()
    return 2


def _serve(config: Path | None) -> int:
    from worker.config import Settings
    from worker.supervisor import Supervisor

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = Settings.load(config)
    except ConfigError as exc:
        print(f"gridmem serve: {exc}", file=sys.stderr)
        return 2
    return Supervisor(settings).run()


if __name__ == "__main__":
    sys.exit(main())
