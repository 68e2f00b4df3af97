"""Under CI=true, real-server tests can be neither skipped, deselected nor left out.

Each sidestep the issue named (issue 12 item 9: `-m fake`, `-k "not valkey"`, a
module-level skip, importorskip) runs here against a small project that uses our
conftest, and must fail the run. The guard counts the real-server tests that
passed per backend against tests/real_tests.toml, and the last test keeps that
file equal to what the whole suite collects.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import expected_real_tests
from tests.frameworks import FRAMEWORKS
from tests.frameworks import installed

ROOT = Path(__file__).resolve().parent.parent
CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
# The small project: three real-server tests on Valkey (one through an `engine`
# parameter, as backend-parametrized tests are), and one fakeredis test.
REAL_ONES = """
import pytest

@pytest.mark.real
def test_real_one():
    pass

@pytest.mark.real
def test_real_two():
    pass

@pytest.mark.fake
def test_fake():
    pass
"""
PARAMETRIZED = """
import pytest

@pytest.mark.real
@pytest.mark.parametrize("engine", ["valkey"])
def test_on_each_engine(engine):
    pass
"""
SKIPPING = """
import pytest

@pytest.mark.real
def test_real_but_skipped():
    pytest.skip("no server")
"""


def inner_project(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, markers: str, **files: str
) -> pytest.Pytester:
    """A project with our conftest, `files`, and real_tests.toml saying 3 valkey tests,
    run under CI=true (and not as a subset run, unless a test says so)."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**files)
    pytester.makeini(f"[pytest]\nmarkers =\n    real: r\n    fake: f\n{markers}")
    expected = {name: 3 if name == "valkey" else 0 for name in ("valkey", "redis", "cluster")}
    pytester.path.joinpath("real_tests.toml").write_text(
        "".join(f"{name} = {count}\n" for name, count in expected.items())
    )
    monkeypatch.setenv("CI", "true")
    # the outer run may be one of .ci/run's subset runs: the inner one is not
    monkeypatch.delenv("CI_SUBSET", raising=False)
    return pytester


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """3 real-server tests (test_a, and a parametrized one in test_b)."""
    return inner_project(pytester, monkeypatch, "", test_a=REAL_ONES, test_b=PARAMETRIZED)


def test_the_whole_suite_passes_the_guard(inner: pytest.Pytester) -> None:
    result = inner.runpytest_subprocess()
    result.assert_outcomes(passed=4)
    assert result.ret == 0


@pytest.mark.parametrize(
    ("args", "passed", "deselected"),
    [(["-m", "fake"], 0, 3), (["-k", "not valkey"], 2, 1),
     (["--deselect", "test_a.py::test_real_two"], 2, 1), (["test_a.py"], 2, 0)],
)  # fmt: skip
def test_leaving_real_tests_out_fails_under_ci(
    inner: pytest.Pytester, args: list[str], passed: int, deselected: int
) -> None:
    result = inner.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*CI guard: real-server tests that did not run*",
            f"valkey: {passed} real-server tests passed, 3 expected",
        ]
    )
    if deselected:
        result.stdout.fnmatch_lines([f"{deselected} real-server tests were deselected*"])


def test_the_guard_counts_across_xdist_workers(inner: pytest.Pytester) -> None:
    """README's test command runs on pytest-xdist: the controller counts the
    workers' passed real-server tests (it never sees their items)."""
    result = inner.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=4)
    assert result.ret == 0


def test_leaving_real_tests_out_fails_under_ci_on_xdist_too(inner: pytest.Pytester) -> None:
    result = inner.runpytest_subprocess("-n", "2", "-k", "not valkey")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["valkey: 2 real-server tests passed, 3 expected"])


def test_a_skipped_real_test_fails_under_ci_on_xdist_too(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_c=SKIPPING)
    result = inner.runpytest_subprocess("-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=4, failed=1)


@pytest.mark.parametrize(
    "skip",
    ['pytest.skip("no server here", allow_module_level=True)', 'pytest.importorskip("gm_no_such")'],
)
def test_a_module_level_skip_fails_under_ci(inner: pytest.Pytester, skip: str) -> None:
    inner.makepyfile(test_b=f"import pytest\n{skip}\n{PARAMETRIZED}")
    result = inner.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["valkey: 2 real-server tests passed, 3 expected"])


def test_without_ci_the_guard_stays_out_of_the_way(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "false")
    result = inner.runpytest_subprocess("-m", "fake")
    result.assert_outcomes(passed=1, deselected=3)
    assert result.ret == 0


def test_a_missing_count_file_fails_under_ci(inner: pytest.Pytester) -> None:
    inner.path.joinpath("real_tests.toml").unlink()
    result = inner.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["cannot read real_tests.toml*"])


def test_collect_only_is_not_a_run(inner: pytest.Pytester) -> None:
    assert inner.runpytest_subprocess("--collect-only", "-q").ret == 0


def test_skipped_real_test_fails_under_ci(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner.makepyfile(test_c=SKIPPING)
    inner.runpytest_subprocess().assert_outcomes(passed=4, failed=1)
    monkeypatch.setenv("CI", "false")
    inner.runpytest_subprocess().assert_outcomes(passed=4, skipped=1)


def test_deselecting_real_tests_is_refused_under_ci(inner: pytest.Pytester) -> None:
    result = inner.runpytest_subprocess("-m", "not real")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*real-server tests may not be deselected*"])


def test_real_tests_toml_matches_the_suite() -> None:
    """The expected counts cannot rot: they must equal what the whole suite collects."""
    missing = [module for module in FRAMEWORKS if not installed(module)]
    if missing and os.environ.get("CI_SUBSET"):
        # .ci/run's fast suites on other Pythons install .[test] only: the integration
        # modules are left out, so the suite's count is not the whole suite's there
        pytest.skip(f"not installed here (gridmem[integrations]): {', '.join(missing)}")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--real-test-counts"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = re.search(r"^real-server tests selected: (.*)$", done.stdout, re.MULTILINE)
    assert line, done.stdout[-2000:]
    collected = {k: int(v) for k, v in re.findall(r"(\w+) = (\d+)", line.group(1))}
    assert collected == expected_real_tests(), (
        f"tests/real_tests.toml says {expected_real_tests()}, the suite collects {collected}: "
        "put these numbers in it (a lower one means real-server tests went away: say why)"
    )
