"""`gridmem-cli` after `pip install gridmem`: runs the bundled bin/gridmem-cli.

The operator CLI is a bash script over redis-cli (bin/gridmem-cli) that finds
gridmem's Lua scripts (`../lua/`) and its formatter next to itself. The wheel
carries it in gridmem/bin/, beside gridmem/lua/; a source checkout has it in bin/.
This entry point execs bash on it with the running Python first on PATH and as
GRIDMEM_PYTHON, so the script's own `python3` calls find this installation.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SCRIPT = "gridmem-cli"


def script_path() -> Path | None:
    """bin/gridmem-cli: inside the installed package, else in the source tree."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "bin" / SCRIPT, package.parent / "bin" / SCRIPT):
        if candidate.is_file():
            return candidate
    return None


def main() -> None:
    script = script_path()
    bash = shutil.which("bash")
    if script is None or bash is None:
        missing = "bash" if bash is None else f"the bundled {SCRIPT} script"
        print(f"{SCRIPT}: cannot find {missing}", file=sys.stderr)
        sys.exit(1)
    env = dict(os.environ)
    env.setdefault("GRIDMEM_PYTHON", sys.executable)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    os.execve(bash, [bash, str(script), *sys.argv[1:]], env)
