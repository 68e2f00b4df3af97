"""The wheel carries the Lua scripts: build it, install it in a fresh venv, use it from there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from worker.scripts import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parent.parent

SMOKE = """
import sys, tempfile
from pathlib import Path
import worker
from worker.scripts import load_scripts, lua_dir
assert Path(worker.__file__).is_relative_to(sys.prefix), worker.__file__
assert lua_dir().is_relative_to(sys.prefix), lua_dir()
scripts = load_scripts()
from worker import AvatarMessage, ConversationStore
from worker.embedded import EmbeddedValkey
with EmbeddedValkey(Path(tempfile.mkdtemp(prefix="gmw", dir="/tmp"))) as server:
    store = ConversationStore(server.client())
    store.record("8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "im", AvatarMessage(text="from the wheel"))
    [m] = store.context("8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "im")
    assert m.content == "from the wheel"
print(len(scripts), "scripts from", lua_dir())
"""


@pytest.mark.slow
def test_wheel_carries_lua_and_works_from_a_fresh_venv() -> None:
    work = Path(tempfile.mkdtemp(prefix="gm-wheel-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(ROOT)],
            check=True,
            capture_output=True,
        )
        [wheel] = list((work / "dist").glob("gridmem-*.whl"))
        names = set(zipfile.ZipFile(wheel).namelist())
        for name in (*SCRIPT_NAMES, "lib"):
            assert f"worker/lua/{name}.lua" in names

        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(wheel)],
            check=True,
            capture_output=True,
        )
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        out = subprocess.run(
            [str(python), "-c", SMOKE],
            check=True,
            capture_output=True,
            text=True,
            cwd=work,  # not the repo: the source tree must not be importable
            env=env,
        )
        assert f"{len(SCRIPT_NAMES)} scripts from {venv}" in out.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
