"""`gridmem demo`'s report and progress output.

The report must explain itself: the burst latency says it includes queueing,
the residents add up to the sessions opened, ended and live, the answered
messages add up to the stored turns, and the deliberate dead letters are marked
as expected (a different count fails the verdict). Progress goes through rich:
a live bar in a terminal, plain lines without `\\r` or escape codes in a pipe or
a log (issue 13, item 6).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gridmem.config import Settings
from worker.demo import Demo
from worker.demo import DemoReport
from worker.demo import print_report
from worker.progress import step

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^  (\S.*?\S)\s{2,}(\S.*)$")
# Variables that make rich draw colours or bars into a pipe; a user may set them, a test not.
FORCING = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "NO_COLOR")


def report_rows(text: str) -> dict[str, str]:
    """The report's `name  value` lines, by name."""
    return {m[1]: m[2] for line in text.splitlines() if (m := ROW.match(line))}


def _ints(pattern: str, text: str) -> list[int]:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in {text!r}"
    return [int(group) for group in found.groups()]


def assert_report_adds_up(text: str) -> None:
    """Every number of the report follows from the others, as its words say."""
    rows = report_rows(text)
    residents, public_only, im_only, both = _ints(
        r"(\d+) residents \((\d+) public only, (\d+) IM only, (\d+) both\)", text
    )
    assert residents == public_only + im_only + both
    answered, sent = _ints(r"^(\d+) of (\d+) sent by residents$", rows["messages answered"])
    assert answered <= sent
    assert re.fullmatch(r"\d+ \(expected: \d+ deliberate bad entries\)", rows["dead letters"])
    assert "queueing included" in rows["latency in a burst"]
    assert "no queue: the service time" in rows["latency one at a time"]
    opened, first, first_public, first_im, later, later_public, later_im = _ints(
        r"^(\d+) = (\d+) on first words \((\d+) public \+ (\d+) IM: one per resident and "
        r"channel\) \+ (\d+) later \((\d+) public \+ (\d+) IM",
        rows["sessions opened"],
    )
    assert opened == first + later
    assert (first, later) == (first_public + first_im, later_public + later_im)
    assert (first_public, first_im) == (public_only + both, im_only + both)
    (ended,) = _ints(r"^(\d+) \(", rows["sessions ended"])
    reasons = re.search(r"^\d+ \(([^)]*)\)", rows["sessions ended"])
    assert reasons and ended == sum(int(n) for n in re.findall(r"=(\d+)", reasons[1]))
    live_public, live_im, opened_again, ended_again = _ints(
        r"^(\d+) / (\d+) = (\d+) opened - (\d+) ended", rows["sessions live (public / im)"]
    )
    assert (opened_again, ended_again) == (opened, ended)
    assert live_public + live_im == opened - ended
    turns, answered_again, in_ended, folded = _ints(
        r"^(\d+) = 2 x (\d+) answered \(words \+ reply\) - (\d+) in ended sessions - "
        r"(\d+) folded into summaries$",
        rows["turns stored"],
    )
    assert answered_again == answered
    assert turns == 2 * answered - in_ended - folded


def _consistent_report() -> DemoReport:
    """A small run written by hand: 10 residents (3 public only, 3 IM only, 4 both).

    Round 1: 14 sessions (7 public, 7 IM), 2 messages each = 28; round 2: two
    idle public residents come back (2 new sessions) and one IM resident (kept);
    round 3: two IM messages. The 7 first public sessions expired with 4 turns
    each; live: 2 public x 2 turns + 7 IM x 4 + 1 x 2 + 2 x 2 = 38 turns.
    """
    return DemoReport(
        residents=10,
        plans=Counter({"public only": 3, "IM only": 3, "both": 4}),
        sent=33,
        answered=33,
        dead_letters=3,
        expected_dead_letters=3,
        latencies_ms=[100.0] * 28,
        burst_seconds=2.0,
        single_ms=[10.0, 12.0],
        pause_minutes=34,
        opened=Counter({"public": 7, "im": 7}),
        opened_later=Counter({"public": 2}),
        ended=Counter({"expired_inactivity": 7}),
        turns_in_ended=28,
        sessions=Counter({"public": 2, "im": 7}),
        turns=38,
        events=Counter({"expired_inactivity": 7}),
        requests_checked=33,
        renewed_public=2,
        idle_public=2,
        kept_im=1,
        idle_im=1,
    )


def _judged(report: DemoReport) -> tuple[DemoReport, str]:
    demo = Demo(residents=10, seed=1, out=io.StringIO())
    demo.report = report
    demo._verdict()
    out = io.StringIO()
    print_report(report, Settings(), out)
    return report, out.getvalue()


def test_a_consistent_report_passes_and_adds_up_in_its_own_words() -> None:
    report, text = _judged(_consistent_report())
    assert report.failures == []
    assert report_rows(text)["verdict"] == "PASS"
    assert_report_adds_up(text)
    rows = report_rows(text)
    assert rows["turns stored"].startswith("38 = 2 x 33 answered (words + reply) - 28 in ended")
    assert rows["sessions opened"].startswith("16 = 14 on first words (7 public + 7 IM")
    assert rows["latency in a burst"].startswith("p50 100 ms, p99 100 ms inbound -> outbound")
    assert "28 messages sent at once, all answered in 2.0 s (14/s)" in rows["latency in a burst"]
    assert rows["latency one at a time"].startswith("p50 12 ms, max 12 ms over 2 messages")
    # and the checker is not blind: a number that does not follow is caught
    with pytest.raises(AssertionError):
        assert_report_adds_up(text.replace("38 = 2 x 33", "39 = 2 x 33"))


def test_the_deliberate_dead_letters_are_marked_and_another_count_fails() -> None:
    _, text = _judged(_consistent_report())
    assert report_rows(text)["dead letters"] == "3 (expected: 3 deliberate bad entries)"
    report = _consistent_report()
    report.dead_letters = 4
    report, text = _judged(report)
    assert report.failures == ["4 dead letters, expected 3"]
    assert report_rows(text)["dead letters"] == "4 (expected: 3 deliberate bad entries)"
    assert report_rows(text)["verdict"] == "FAIL: 4 dead letters, expected 3"


def test_turns_or_sessions_that_do_not_add_up_fail_the_verdict() -> None:
    report = _consistent_report()
    report.turns += 2  # a stored turn the answered messages do not explain
    assert _judged(report)[0].failures == ["turns do not add up: 40 stored, 38 expected"]
    report = _consistent_report()
    report.sessions["public"] += 1  # a live session the demo never opened
    assert _judged(report)[0].failures == ["live sessions do not add up"]


def test_progress_into_a_pipe_is_one_plain_line_per_step() -> None:
    read_end, write_end = os.pipe()
    with open(write_end, "w", encoding="utf-8") as out:
        for label in ("first step", "second step"):
            with step(out, label, 3) as bar:
                for done in range(4):
                    bar(done)
    with open(read_end, "rb") as pipe:
        written = pipe.read()
    assert b"\r" not in written and b"\x1b" not in written
    lines = written.decode().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"  first step\s+3/3 0:00:0\d", lines[0])
    assert lines[1].startswith("  second step")


def test_progress_in_a_terminal_draws_a_live_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FORCING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    master, slave = os.openpty()
    with open(slave, "w", encoding="utf-8") as tty, step(tty, "talking", 2) as bar:
        bar(1)
        bar(2)
    written = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # Linux: EIO once the other side is closed and everything read
            break
        if not chunk:
            break
        written += chunk
    os.close(master)
    assert b"\r" in written and b"\x1b[" in written  # redrawn in place, with colours
    assert "━".encode() in written and b"2/2" in written


def test_no_hand_written_carriage_return_bars_left() -> None:
    """The demo and the benches draw progress through worker.progress only.

    A bar redraws with a bare carriage return; a CR LF line end (an HTTP request
    written by hand in bench/service.py) is not one."""
    bare_cr = re.compile(r"\r(?!\n)")
    files = [ROOT / "worker" / "demo.py", *sorted((ROOT / "bench").glob("*.py"))]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not bare_cr.search(node.value), f"{path.name}:{node.lineno} writes a \\r"


@pytest.mark.real
@pytest.mark.slow
def test_demo_into_a_pipe_writes_no_carriage_return_or_escape_code() -> None:
    """The demo itself, stdout a pipe as in a log or CI: plain lines, a report that adds up."""
    env = {k: v for k, v in os.environ.items() if k not in FORCING}
    env["TERM"] = "xterm-256color"  # a terminal type, but stdout is not a terminal
    code = (
        "import sys\n"
        "from worker.demo import run_demo\n"
        "sys.exit(1 if run_demo(residents=30, processes=1, speed=600).failures else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,  # stdout is a pipe
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert b"\r" not in done.stdout and b"\x1b" not in done.stdout
    text = done.stdout.decode()
    for label in ("residents talking", "idle residents back", "one message at a time"):
        assert re.search(rf"^  {label}\s+(\d+)/\1 \d+:\d\d:\d\d$", text, re.M), text
    assert_report_adds_up(text)
    assert report_rows(text)["verdict"] == "PASS"


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize(
    ("residents", "seed"),
    [(1, 7), (1, 0), (2, 1)],  # seed 7 (the CLI's): public and IM; 0: IM only; 1: two on IM
)
def test_a_tiny_demo_runs_and_passes(residents: int, seed: int) -> None:
    """Regression (issue 13, found by trying it): `gridmem demo --residents 1` ended in a
    traceback (the idle residents were drawn as a sample of two out of one), and a run
    whose residents all talk on IM failed its own verdict ("idle public sessions were
    not renewed"), though there was no public session to renew."""
    code = (
        "import sys\n"
        "from worker.demo import run_demo\n"
        f"r = run_demo(residents={residents}, processes=1, seed={seed}, speed=600)\n"
        "sys.exit(1 if r.failures else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=300, check=False
    )
    said = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in said, said
    assert_report_adds_up(done.stdout.decode())
    assert report_rows(done.stdout.decode())["verdict"] == "PASS", said
