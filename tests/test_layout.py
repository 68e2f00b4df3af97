"""The layout is the architecture: `gridmem` is the library an agent imports, `worker`
the service `gridmem serve` runs. The library never imports the service (DESIGN.md
section 2): a project with its own `worker` package must be able to use gridmem."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import gridmem

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "gridmem"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_library_module_imports_the_service() -> None:
    offenders = {
        f"{path.name}: {name}"
        for path in sorted(LIBRARY.glob("*.py"))
        for name in imported_modules(path)
        if name == "worker" or name.startswith("worker.")
    }
    assert not offenders


def test_importing_every_library_module_loads_nothing_of_the_service() -> None:
    modules = [f"gridmem.{m.name}" for m in pkgutil.iter_modules(gridmem.__path__)]
    assert "gridmem.store" in modules and "gridmem.embedded" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'worker' or m.startswith('worker.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_a_users_own_worker_package_does_not_shadow_the_library(tmp_path: Path) -> None:
    """Most job-queue apps have a `worker` package of their own."""
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "__init__.py").write_text("MINE = True\n")
    code = (
        "import worker, gridmem\n"
        "from gridmem import ConversationStore, ManualClock\n"
        "assert worker.MINE\n"
        "print(ConversationStore.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "gridmem.store"


def test_the_service_package_holds_only_the_service() -> None:
    service = {p.stem for p in (ROOT / "worker").glob("*.py")} - {"__init__", "__main__"}
    library = {p.stem for p in LIBRARY.glob("*.py")} - {"__init__"}
    assert "service" in service and "supervisor" in service and "cli" in service
    assert "store" in library and "snapshots" in library
    assert not service & library, "a module name in both packages"


def test_every_service_module_the_design_names_exists() -> None:
    """DESIGN.md section 2 lists the service's modules; the inbound queue's entry
    checks live in their own (worker/inbound.py), not inside service.py."""
    named = {"service", "inbound", "supervisor", "llm", "metrics", "demo", "cli"}
    present = {p.stem for p in (ROOT / "worker").glob("*.py")}
    assert named <= present, f"missing: {sorted(named - present)}"
    assert "def check_inbound" not in (ROOT / "worker" / "service.py").read_text()
