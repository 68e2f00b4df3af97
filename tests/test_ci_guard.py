"""Under CI=true, real-server tests can neither be skipped nor deselected."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
SKIPPING = """
import pytest

@pytest.mark.real
def test_real_but_skipped():
    pytest.skip("no server")
"""


def test_skipped_real_test_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=SKIPPING)
    pytester.makeini("[pytest]\nmarkers =\n    real: r\n    fake: f\n")
    monkeypatch.setenv("CI", "true")
    pytester.runpytest_subprocess().assert_outcomes(failed=1)
    monkeypatch.setenv("CI", "false")
    pytester.runpytest_subprocess().assert_outcomes(skipped=1)


def test_deselecting_real_tests_is_refused_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=SKIPPING)
    pytester.makeini("[pytest]\nmarkers =\n    real: r\n    fake: f\n")
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-m", "not real")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*real-server tests may not be deselected*"])
