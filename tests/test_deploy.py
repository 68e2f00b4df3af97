"""compose.yaml, the Dockerfile and the example config agree with the code (Docker is not run here)."""

from __future__ import annotations

import configparser
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel

from gridmem.config import LIMIT_TABLE
from gridmem.config import Settings
from worker.cli import build_parser
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


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    return services


def _in_profile(profile: str | None) -> dict[str, Any]:
    """The services `docker compose up` starts with that profile (None: no profile)."""
    return {
        name: service
        for name, service in _services().items()
        if (profile in service["profiles"] if "profiles" in service else profile is None)
    }


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container gets it, `${X:-}` left unset."""
    return {k: v for k, v in service["environment"].items() if not v.startswith("${")}


def test_compose_services_and_environment() -> None:
    services = _in_profile(None)
    assert set(services) == {"valkey", "worker"}
    # and `docker compose up` starts nothing of a profile through a dependency
    assert all(set(s.get("depends_on", {})) <= set(services) for s in services.values())
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


def test_the_cluster_profile_forms_a_cluster_for_its_workers(monkeypatch: Any) -> None:
    """Issue 15: six cluster-enabled nodes tuned as the single node is, a one-shot job
    that waits for all six and forms the cluster from all six, and workers in cluster
    mode that start once it has."""
    cluster, single = _in_profile("cluster"), _services()["valkey"]
    nodes = {n: s for n, s in cluster.items() if "valkey-server" in s.get("command", [])}
    assert len(nodes) == 6
    for node in nodes.values():
        assert node["image"] == single["image"] and "healthcheck" in node
        command = node["command"]
        assert command[: len(single["command"])] == single["command"]  # the same tuning
        assert dict(zip(command[1::2], command[2::2], strict=True))["--cluster-enabled"] == "yes"
    [(job_name, job)] = [(n, s) for n, s in cluster.items() if s.get("restart") == "no"]
    assert job["depends_on"] == {n: {"condition": "service_healthy"} for n in nodes}
    raw = "\n".join(job["command"])
    assert "$" not in raw.replace("$$", ""), "a lone $ is compose's to interpolate"
    script = raw.replace("$$", "$")  # what the shell gets
    assert subprocess.run(["sh", "-n", "-c", script], check=False).returncode == 0
    [create] = [line for line in script.splitlines() if "--cluster create" in line]
    assert "--cluster-replicas 1" in create and "--cluster-yes" in create
    assert all(re.search(rf"\b{re.escape(n)}\b", script) for n in nodes)
    workers = {n: s for n, s in cluster.items() if "build" in s}
    assert workers and set(cluster) == {*nodes, job_name, *workers}
    for worker in workers.values():
        assert worker["depends_on"] == {job_name: {"condition": "service_completed_successfully"}}
        assert worker["deploy"]["replicas"] >= 2
        assert worker["healthcheck"]["test"][1:] == ["gridmem", "cluster-check"]
        environment = _environment(worker)
        assert all(_setting_exists(v) for v in environment if v.startswith("GRIDMEM_"))
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        settings = Settings.load()  # what the worker starts with, checked as it checks it
        assert settings.redis.cluster is True and settings.redis.url is not None
        assert urlsplit(settings.redis.url).hostname in nodes
    assert "cluster-check" in build_parser().parse_args(["cluster-check"]).command


def test_compose_publishes_no_host_port_twice() -> None:
    """Both setups can run side by side (`--profile cluster up` starts the default one
    too): no host port is published twice."""
    published = [
        str(port).rsplit(":", 1)[0].rpartition(":")[2]
        for service in _services().values()
        for port in service.get("ports", [])
    ]
    assert published and len(published) == len(set(published)), published
