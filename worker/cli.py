"""The `gridmem` command."""

from __future__ import annotations

import argparse
import sys

from worker import __version__


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
    demo = commands.add_parser(
        "demo",
        help="scripted residents talk to a private store; prints a report",
        description="Start a private Valkey, let scripted residents talk on both channels, "
        "simulate 30 minutes of silence, and report turns, latency, sessions, events "
        "and an isolation self-check.",
    )
    demo.add_argument("--residents", type=_positive, default=1000, help="default: 1000")
    demo.add_argument(
        "--turns", type=_positive, default=4, help="exchanges per session (default: 4)"
    )
    demo.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from worker.demo import run_demo

        report = run_demo(residents=args.residents, turns=args.turns, seed=args.seed)
        return 1 if report.isolation_failures else 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
