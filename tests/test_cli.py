"""The `gridmem` command."""

from __future__ import annotations

import io

import pytest

from tests.test_demo import assert_report_adds_up
from worker.cli import main
from worker.demo import run_demo

pytestmark = pytest.mark.real


@pytest.mark.slow
def test_demo_passes_its_own_checks() -> None:
    out = io.StringIO()
    report = run_demo(residents=120, processes=2, out=out, speed=600)
    text = out.getvalue()
    assert report.failures == []
    assert report.answered == report.sent > 200
    assert report.dead_letters == report.expected_dead_letters == 3
    assert report.requests_checked >= report.answered and report.leaks == 0
    assert report.redactions > 0 and report.secrets_found == 0
    assert report.renewed_public == report.idle_public > 0
    assert report.events["expired_inactivity"] > 0
    assert len(report.single_ms) == 20 and report.turns == report.expected_turns
    for label in (
        "messages answered",
        "(expected: 3 deliberate bad entries)",
        "inbound -> outbound, queueing included",
        "no queue: the service time",
        "isolation self-check",
        "PASS",
    ):
        assert label in text
    assert_report_adds_up(text)
    assert "\r" not in text and "\x1b" not in text  # progress into a non-terminal


def test_help_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "demo" in out and "serve" in out
    with pytest.raises(SystemExit) as done:
        main(["demo", "--residents", "0"])
    assert done.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert main([]) == 2


def test_serve_reports_a_bad_config(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "bad.toml"
    config.write_text("[worker]\nprocesses = 0\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "worker.processes" in capsys.readouterr().err
