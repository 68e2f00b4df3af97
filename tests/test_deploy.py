"""compose.yaml, the Dockerfile and the example config agree with the code (Docker is not run here)."""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gridmem.config import LIMIT_TABLE, Settings
from worker.supervisor import GRACEFUL_STOP_SECONDS

ROOT = Path(__file__).resolve().parent.parent


def _setting_exists(variable: str) -> bool:
    """GRIDMEM_LLM__BASE_URL -> Settings.llm.base_url, following nested models."""
    model: Any = Settings
    for part in variable.removeprefix("GRIDMEM_").lower().split("__"):
        if (
            not (isinstance(model, type) and issubclass(model, BaseModel))
            or part not in model.model_fields
        ):
            return False
        model = model.model_fields[part].annotation
    return True


def test_compose_services_and_environment() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"valkey", "worker"}
    valkey, worker = services["valkey"], services["worker"]
    assert "valkey" in valkey["image"] and "healthcheck" in valkey
    assert worker["deploy"]["replicas"] >= 2 and "healthcheck" in worker
    assert worker["depends_on"]["valkey"]["condition"] == "service_healthy"
    assert (
        (ROOT / worker["build"] / "Dockerfile").exists()
        if isinstance(worker["build"], str)
        else True
    )
    variables = [v for v in worker["environment"] if v.startswith("GRIDMEM_")]
    assert variables and all(_setting_exists(v) for v in variables), variables
    assert "GRIDMEM_REDIS__URL" in variables
    assert not _setting_exists("GRIDMEM_REDIS__NOPE")


def test_empty_environment_values_mean_unset(monkeypatch: Any) -> None:
    monkeypatch.setenv("GRIDMEM_LLM__BASE_URL", "")
    monkeypatch.setenv("GRIDMEM_REDIS__URL", "redis://valkey:6379/0")
    settings = Settings.load()
    assert settings.llm.base_url is None and settings.redis.url == "redis://valkey:6379/0"


def test_dockerfile_installs_the_package_and_serves() -> None:
    """Regression: the image copied worker/ and lua/ but not gridmem/ or bin/, which the
    wheel is built from (`pip install .` could not build it): every path the wheel
    takes is copied before the install."""
    text = (ROOT / "Dockerfile").read_text()
    assert '"serve"' in text and "USER gridmem" in text
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    wheel = wheel["targets"]["wheel"]
    sources = {*wheel["packages"], *(path.split("/")[0] for path in wheel["force-include"])}
    copied = set(re.findall(r"^COPY (\S+) ", text, re.MULTILINE))
    assert sources <= copied, sources - copied
    install = text.index("pip install")
    assert all(text.index(f"COPY {source} ") < install for source in sources)


def test_example_config_loads_and_documents_the_defaults() -> None:
    settings = Settings.load(ROOT / "gridmem.example.toml")
    assert settings.conversation.limits.model_dump() == {k: d for k, (d, _) in LIMIT_TABLE.items()}
    assert settings.llm.base_url is None and settings.redis.url is None
    defaults = Settings()
    assert settings.worker == defaults.worker and settings.llm == defaults.llm


def test_the_systemd_unit_stops_only_the_supervisor_first() -> None:
    """Regression (issue 13, item 2): systemd's default stop (KillMode=control-group)
    signals every process of the unit at once, the private Valkey too, which then
    dies before the workers' replies and the last snapshot. The shipped unit stops the
    supervisor alone first (KillMode=mixed), and waits longer than its graceful stop."""
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string((ROOT / "examples" / "gridmem.service").read_text())
    service = unit["Service"]
    assert service["KillMode"] == "mixed"
    assert service.get("KillSignal", "SIGTERM") in {"SIGTERM", "SIGINT"}
    assert service["ExecStart"].split()[1:3] == ["serve", "--config"]
    assert float(service["TimeoutStopSec"]) > GRACEFUL_STOP_SECONDS
    assert unit["Install"]["WantedBy"] == "multi-user.target"
