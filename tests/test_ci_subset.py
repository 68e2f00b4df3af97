"""CI_SUBSET: .ci/run's fast-suite runs on other Pythons pass the CI guard on purpose.

The guard (tests/conftest.py) fails any run under CI=true that passes fewer
real-server tests than tests/real_tests.toml, so a `-m "not slow"` run would
fail. A run that names itself a subset (CI_SUBSET) is spared the counts, which
the run of the whole suite checks; a skipped real-server test still fails it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_ci_guard import REAL_ONES
from tests.test_ci_guard import SKIPPING
from tests.test_ci_guard import inner_project

ROOT = Path(__file__).resolve().parent.parent
SLOW = """
import pytest

@pytest.mark.real
@pytest.mark.slow
def test_real_and_slow():
    pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """3 real-server tests, one of them slow."""
    return inner_project(pytester, monkeypatch, "    slow: s\n", test_a=REAL_ONES, test_slow=SLOW)


def test_a_fast_run_under_ci_fails_the_guard_without_ci_subset(inner: pytest.Pytester) -> None:
    result = inner.runpytest_subprocess("-m", "not slow")
    result.assert_outcomes(passed=3, deselected=1)
    assert result.ret != 0


def test_a_fast_run_named_a_subset_passes(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI_SUBSET", "fast suite, python3.12")
    result = inner.runpytest_subprocess("-m", "not slow")
    result.assert_outcomes(passed=3, deselected=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*counts not checked*CI_SUBSET=fast suite, python3.12*"])


def test_a_subset_still_fails_a_skipped_real_test(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI_SUBSET", "fast suite")
    inner.makepyfile(test_c=SKIPPING)
    result = inner.runpytest_subprocess("-m", "not slow")
    assert result.ret != 0
    result.assert_outcomes(passed=3, failed=1, deselected=1)


def test_ci_run_runs_the_fast_suite_on_each_other_python() -> None:
    """.ci/run: the fast suite per extra Python, as a CI_SUBSET run, in its own venv."""
    run = ROOT / ".ci" / "run"
    text = run.read_text(encoding="utf-8")
    assert "for version in 3.12 3.13" in text
    command = text.replace("\\\n", " ")  # the command, its continuation lines joined
    assert re.search(
        r'CI_SUBSET="fast suite, python\$version" HYPOTHESIS_PROFILE=ci-subset\s+'
        r'"\$venv/bin/python" -m pytest -m "not slow"',
        command,
    )
    # side by side: each in the background, and every one waited for
    assert re.search(r'^\s*\) >"\$log" 2>&1 &$', text, re.M)
    assert 'wait "${pids[$i]}"' in text
    subprocess.run(["bash", "-n", str(run)], check=True)
    finder = re.search(r"^find_python\(\) \{.*?^\}", text, re.M | re.S)
    assert finder is not None
    missing = subprocess.run(
        ["bash", "-c", finder.group(0) + "\nfind_python 3.99"], capture_output=True, check=False
    )
    assert missing.returncode == 1 and missing.stdout == b""
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert {".venv312/", ".venv313/"} <= set(ignored)
