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


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with our conftest and one real-server test that skips."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=SKIPPING)
    pytester.makeini("[pytest]\nmarkers =\n    real: r\n    fake: f\n")
    return pytester


def test_skipped_real_test_fails_under_ci(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    inner.runpytest_subprocess().assert_outcomes(failed=1)
    monkeypatch.setenv("CI", "false")
    inner.runpytest_subprocess().assert_outcomes(skipped=1)


def test_deselecting_real_tests_is_refused_under_ci(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = inner.runpytest_subprocess("-m", "not real")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*real-server tests may not be deselected*"])
