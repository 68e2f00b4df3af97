"""The `gridmem` command."""

from __future__ import annotations

import io

import pytest

from worker.cli import main
from worker.demo import run_demo

pytestmark = pytest.mark.real


def test_demo_reports_and_self_checks() -> None:
    out = io.StringIO()
    report = run_demo(residents=40, turns=2, out=out)
    text = out.getvalue()
    assert report.turns == sum(report.sessions.values()) * 4
    assert report.isolation_checked > 0 and report.isolation_failures == 0
    assert report.expired_by_sweep == report.sessions["public"] > 0
    assert report.events["expired_inactivity"] == report.expired_by_sweep
    for label in ("turns recorded", "record latency", "isolation self-check", "40/40 residents"):
        assert label in text


def test_help_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["demo", "--residents", "0"])
    assert done.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert main([]) == 2
