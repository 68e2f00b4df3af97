"""The wheel carries the Lua scripts, the operator CLI, py.typed and the LICENSE: build
it, install it in a fresh venv, use it from there. And what the sdist and the docs name
is in the repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from gridmem.scripts import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parent.parent

SMOKE = """
import sys, tempfile
from pathlib import Path
import subprocess
import gridmem, worker
from gridmem.scripts import load_scripts, lua_dir
for package in (gridmem, worker):
    assert Path(package.__file__).is_relative_to(sys.prefix), package.__file__
assert lua_dir().is_relative_to(sys.prefix), lua_dir()
scripts = load_scripts()
from gridmem import AvatarMessage, ConversationStore
from gridmem.embedded import EmbeddedValkey
with EmbeddedValkey(Path(tempfile.mkdtemp(prefix="gmw", dir="/tmp"))) as server:
    store = ConversationStore(server.client())
    store.record("8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "im", AvatarMessage(text="from the wheel"))
    [m] = store.context("8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "im")
    assert m.content == "from the wheel"
    # the operator CLI, installed as a script, runs its bundled bash and Lua
    cli = Path(sys.executable).parent / "gridmem-cli"
    listed = subprocess.run(
        [str(cli), "--socket", str(server.socket_path), "--json", "sessions"],
        check=True, capture_output=True, text=True,
    )
    assert "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90" in listed.stdout, listed.stdout
print(len(scripts), "scripts from", lua_dir())
"""

# Typed code of a user: their mypy must read gridmem's annotations (py.typed).
USER_CODE = """
from gridmem import AsyncConversationStore, AvatarMessage, ConversationStore, Receipt


def remember(store: ConversationStore, uuid: str) -> Receipt:
    return store.record(uuid, "im", AvatarMessage(text="hello"))


async def remember_async(store: AsyncConversationStore, uuid: str) -> Receipt:
    return await store.record(uuid, "im", AvatarMessage(text="hello"))
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
            assert f"gridmem/lua/{name}.lua" in names
        assert {"gridmem/py.typed", "worker/py.typed"} <= names
        assert {"gridmem/bin/gridmem-cli", "gridmem/bin/gridmem-cli-format"} <= names
        [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"MIT License" in zipfile.ZipFile(wheel).read(license_file)

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
        (work / "user.py").write_text(USER_CODE)
        typed = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "--python-executable",
                str(python),
                "user.py",
            ],
            check=False,  # its output says why
            capture_output=True,
            text=True,
            cwd=work,
            env=env,
        )
        assert typed.returncode == 0, (
            typed.stdout
        )  # without py.typed: "missing ... py.typed marker"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_license_is_mit_by_gridmem_developers() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    with (ROOT / "pyproject.toml").open("rb") as project:
        meta = tomllib.load(project)["project"]
    assert meta["license"] == "MIT" and text.startswith("MIT License")
    assert re.search(r"^Copyright \(c\) \d{4} gridmem developers$", text, re.M)


def test_the_sdist_names_only_what_exists() -> None:
    with (ROOT / "pyproject.toml").open("rb") as project:
        include = tomllib.load(project)["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]
    assert [name for name in include if not (ROOT / name).exists()] == []


def test_python_versions_are_declared() -> None:
    with (ROOT / "pyproject.toml").open("rb") as project:
        meta = tomllib.load(project)["project"]
    declared = {c.rsplit(" :: ", 1)[1] for c in meta["classifiers"] if re.search(r"3\.\d+$", c)}
    assert declared == {"3.11", "3.12", "3.13"} and meta["requires-python"] == ">=3.11"


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_docs_cite_no_file_outside_the_repository(doc: Path) -> None:
    """A reader of a clone has the repository only: no ../shared, /work/..., DESIGN.md."""
    text = doc.read_text(encoding="utf-8")
    assert (
        re.findall(r"\.\./shared|\bshared/|DESIGN(?:\.md)?\b|(?<![\w:/])/(?:work|home|root)/", text)
        == []
    )
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), target
