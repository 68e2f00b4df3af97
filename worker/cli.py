"""The `gridmem` command."""

from __future__ import annotations

import argparse
import sys

from worker import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gridmem", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gridmem {__version__}")
    parser.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
