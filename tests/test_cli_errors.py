"""What a person sees when a command cannot start: one line, the setting, an exit status.

Issue 13 items 4, 12, 13 and 14 (`--residents abc`): an unreachable Redis, an
http:// URL, a storage_path under /proc or below a file, a socket path too long
for the OS all ended `gridmem serve` / `gridmem demo` in a traceback (or in one
log line and the wrong status, or a demo that waited its whole minute), and
`bin/gridmem-cli` with a bad URL scheme exited 1. Each case runs the real command
as a subprocess from a fresh directory, as a newcomer meets it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import redis as redis_py

from gridmem.config import Settings
from gridmem.config import endpoints
from gridmem.config import redacted_url
from gridmem.config import unknown_environment
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import cli_binary
from gridmem.errors import ConfigError
from tests.conftest import short_tempdir
from tests.helpers import OutputLines

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "bin" / "gridmem-cli"
SECRET = "hunter2-secret"
DEADLINE = 60.0
# a directory name that makes storage_path/valkey/valkey.sock longer than any sun_path
LONG = "s" * 110


@pytest.fixture
def fresh() -> Iterator[Path]:
    """An empty directory (short: socket paths inside it must fit), holding one file."""
    path = short_tempdir("gm-err-")
    (path / "a-file").write_text("not a directory\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without any GRIDMEM_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRIDMEM_")}
    return {**env, "GRIDMEM_REDIS_CLI": cli_binary(), **extra}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE, check=False
    )


class Case(NamedTuple):
    argv: list[str]  # after the program; {long} is a path too long for a socket
    env: dict[str, str]
    status: int
    said: list[str]  # each must be in the one line on stderr


GRIDMEM = [sys.executable, "-m", "worker"]
UNREACHABLE = f"redis://:{SECRET}@127.0.0.1:1/0"  # port 1: nothing listens
HTTP = f"http://user:{SECRET}@example.org/"

# The same set-up problems through the environment, for `serve` and `demo` (the demo's
# settings read GRIDMEM_* too).
SETUP_PROBLEMS: dict[str, tuple[dict[str, str], int, list[str]]] = {
    "unreachable-redis": (
        {"GRIDMEM_REDIS__URL": UNREACHABLE},
        1,
        ["cannot reach Redis at redis://:***@127.0.0.1:1/0", "GRIDMEM_REDIS__URL"],
    ),
    "http-url": (
        {"GRIDMEM_REDIS__URL": HTTP},
        2,
        ["redis.url", "GRIDMEM_REDIS__URL", "redis://, rediss:// or unix://"],
    ),
    "storage-under-proc": (
        {"GRIDMEM_STORAGE_PATH": "/proc/gridmem-nope"},
        2,
        ["storage_path /proc/gridmem-nope", "GRIDMEM_STORAGE_PATH"],
    ),
    "storage-below-a-file": (
        {"GRIDMEM_STORAGE_PATH": "a-file/gridmem-data"},
        2,
        ["storage_path", "a-file/gridmem-data", "Not a directory"],
    ),
    "socket-path-too-long": (
        {"GRIDMEM_STORAGE_PATH": "{long}"},
        2,
        ["too long for a Unix socket", "storage_path"],
    ),
    "llm-base-url": (
        {"GRIDMEM_LLM__BASE_URL": "not a url"},
        2,
        ["llm.base_url", "GRIDMEM_LLM__BASE_URL", "http://"],
    ),
}

CASES: dict[str, Case] = {
    **{
        f"serve-{name}": Case([*GRIDMEM, "serve"], env, status, said)
        for name, (env, status, said) in SETUP_PROBLEMS.items()
    },
    **{
        f"demo-{name}": Case([*GRIDMEM, "demo", "--residents", "5"], env, status, said)
        for name, (env, status, said) in SETUP_PROBLEMS.items()
    },
    "cli-unreachable-redis": Case(
        [str(CLI), "-u", UNREACHABLE, "stats"],
        {},
        1,
        ["cannot use the server at redis://:***@127.0.0.1:1/0 (--url)", "Connection refused"],
    ),
    "cli-unreachable-redis-from-env": Case(
        [str(CLI), "stats"],
        {"GRIDMEM_REDIS__URL": UNREACHABLE},
        1,
        ["redis://:***@127.0.0.1:1/0 ($GRIDMEM_REDIS__URL)"],
    ),
    # found by trying it: the password in the query, straight after the host, was printed
    "cli-query-password": Case(
        [str(CLI), "-u", f"redis://127.0.0.1:1?password={SECRET}", "stats"],
        {},
        1,
        ["cannot use the server at redis://127.0.0.1:1 (--url)"],
    ),
    "serve-query-password": Case(
        [*GRIDMEM, "serve"],
        {"GRIDMEM_REDIS__URL": f"redis://:{SECRET}@127.0.0.1:1?password={SECRET}"},
        1,
        ["cannot reach Redis at redis://:***@127.0.0.1:1 (redis.url"],
    ),
    "cli-http-url": Case(
        [str(CLI), "-u", HTTP, "stats"], {}, 2, ["--url", "unsupported URL scheme 'http'"]
    ),
    "cli-storage-under-proc": Case(
        [str(CLI), "--storage", "/proc/gridmem-nope", "stats"],
        {},
        2,
        ["/proc/gridmem-nope/valkey/valkey.sock", "--storage", "--url"],
    ),
    "cli-storage-below-a-file": Case(
        [str(CLI), "stats"],
        {"GRIDMEM_STORAGE_PATH": "a-file/gridmem-data"},
        2,
        ["a-file/gridmem-data/valkey/valkey.sock", "$GRIDMEM_STORAGE_PATH"],
    ),
    "cli-socket-path-too-long": Case(
        [str(CLI), "-s", "{long}/valkey.sock", "sessions"],
        {},
        2,
        ["--socket", "too long for a Unix socket"],
    ),
    # the newcomer's case: no server running here, and one on 127.0.0.1:6379 that is
    # another store's (it was asked silently before)
    "cli-no-server-here": Case(
        [str(CLI), "sessions"], {}, 2, ["no private Valkey socket at gridmem-data/valkey"]
    ),
}

SLOW = pytest.mark.slow  # serve and demo start Python, import everything, spawn


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[] if name.startswith("cli-") else [SLOW]) for name in CASES],
)
def test_a_command_that_cannot_start_says_why_in_one_line(fresh: Path, name: str) -> None:
    """Regression (issue 13 item 4): tracebacks, a wrong exit status, a demo waiting a
    minute for a service that had given up, a CLI that exited 1 for a usage error or
    talked to 127.0.0.1:6379 unasked."""
    case = CASES[name]
    long = str(fresh / LONG)
    argv = [arg.replace("{long}", long) for arg in case.argv]
    env = _environment(**{k: v.replace("{long}", long) for k, v in case.env.items()})
    # When the command runs in a fresh directory
    done = _run(argv, fresh, env)
    # Then it stops with the status for its kind of problem and one line saying it
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == case.status, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    for words in case.said:
        assert words in lines[0], lines[0]


# -- the settings behind them ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://x", "localhost:6379", "127.0.0.1", f"https://u:{SECRET}@h", "redis://h:99999",
     f"redis://:{SECRET}@[::1"],
)  # fmt: skip
def test_a_redis_url_redis_py_cannot_use_is_a_config_error(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 13 item 4): an http:// URL passed validation and ended
    `gridmem serve` in a ValueError traceback from redis-py's parse_url."""
    monkeypatch.setenv("GRIDMEM_REDIS__URL", url)
    with pytest.raises(ConfigError, match=r"redis\.url \(GRIDMEM_REDIS__URL\)") as refused:
        Settings.load()
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "url", ["redis://localhost:6379/0", f"rediss://u:{SECRET}@h:6380", "unix:///tmp/x.sock"]
)
def test_redis_urls_redis_py_takes_are_accepted(url: str) -> None:
    assert Settings(redis={"url": url}).redis.url == url


@pytest.mark.parametrize(
    "base_url",
    [
        "not a url",
        "localhost:11434/v1",
        "ftp://h/v1",
        "http://",
        "https://h:notaport",
        # found by trying it: accepted, then every message failed (the client quotes them)
        " https://api.openai.com/v1",
        "http://127.0.0.1:11434/v1 ",
        "http://exa mple.com/v1",
        "http://h/v1\\t",
    ],
)
def test_an_llm_base_url_that_is_not_http_is_refused_at_start(base_url: str, fresh: Path) -> None:
    """Regression (issue 13 item 13): `[llm] base_url = "not a url"` was accepted and
    every message then failed, one at a time."""
    config = fresh / "gridmem.toml"
    config.write_text(f'[llm]\nbase_url = "{base_url}"\n')
    with pytest.raises(ConfigError, match=r"llm\.base_url \(GRIDMEM_LLM__BASE_URL\)"):
        Settings.load(config)


def test_serve_refuses_a_config_file_with_a_bad_llm_base_url(fresh: Path) -> None:
    (fresh / "gridmem.toml").write_text('[llm]\nbase_url = "not a url"\n')
    done = _run([*GRIDMEM, "serve", "--config", "gridmem.toml"], fresh, _environment())
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("gridmem serve: invalid settings: llm.base_url"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (fresh / "gridmem-data").exists()


@pytest.mark.parametrize(
    "base_url", ["http://127.0.0.1:11434/v1", "https://api.openai.com/v1", "HTTP://h"]
)
def test_http_llm_base_urls_are_accepted(base_url: str) -> None:
    assert Settings(llm={"base_url": base_url}).llm.base_url == base_url


def test_urls_in_log_lines_carry_no_password_or_query() -> None:
    assert redacted_url(f"redis://:{SECRET}@h:6379/0") == "redis://:***@h:6379/0"
    assert redacted_url(f"redis://user:{SECRET}@h") == "redis://user:***@h"
    assert redacted_url(f"redis://{SECRET}@h") == "redis://***@h"  # redis-cli: a password
    assert redacted_url(f"https://h/v1?api-key={SECRET}") == "https://h/v1"
    assert redacted_url(f"unix://:{SECRET}@/tmp/x.sock") == "unix://:***@/tmp/x.sock"
    assert redacted_url("unix:///tmp/x.sock") == "unix:///tmp/x.sock"
    # found by trying it: a query straight after the host, or both at once, was printed
    assert redacted_url(f"redis://h:6379?password={SECRET}") == "redis://h:6379"
    assert redacted_url(f"redis://:{SECRET}@h:1?password={SECRET}") == "redis://:***@h:1"
    assert redacted_url(f"redis://:{SECRET}/x@h:1/0") == "redis://:***@h:1/0"  # unencoded /
    assert redacted_url(f"https://h/v1#{SECRET}") == "https://h/v1"


# -- item 12: GRIDMEM_* variables that set nothing --------------------------------------------


def test_unknown_gridmem_variables_are_named_with_the_nearest_spelling() -> None:
    """Regression (issue 13 item 12): GRIDMEM_REDIS_URL (one underscore) was ignored
    silently, and `gridmem serve` quietly started a private server instead."""
    settings = Settings(llm={"api_key_env": "GRIDMEM_OPENAI_KEY"})
    environ = {
        "GRIDMEM_REDIS_URL": "redis://h",
        "GRIDMEM_LLM_BASE_URL": "http://h",
        "GRIDMEM_CONVERSATION_LIMITS_MAX_EVENTS": "5",
        "gridmem_worker_processes": "3",
        "GRIDMEM_FROBNICATE": "1",
        # what is fine: settings, sections, gridmem-cli's own, the key variable named
        "GRIDMEM_REDIS__URL": "redis://h",
        "GRIDMEM_STORAGE_PATH": "x",
        "GRIDMEM_REDIS": "{}",
        "GRIDMEM_REDIS_CLI": "redis-cli",
        "GRIDMEM_PYTHON": "python3",
        "GRIDMEM_OPENAI_KEY": SECRET,
        "GRIDMEM_REDIS__NOPE": "1",  # validation refuses it already, naming it
        "REDIS_URL": "redis://h",
    }
    said = unknown_environment(environ, settings)
    suggestions = {
        "GRIDMEM_REDIS_URL": "did you mean GRIDMEM_REDIS__URL?",
        "GRIDMEM_LLM_BASE_URL": "did you mean GRIDMEM_LLM__BASE_URL?",
        "GRIDMEM_CONVERSATION_LIMITS_MAX_EVENTS": (
            "did you mean GRIDMEM_CONVERSATION__LIMITS__MAX_EVENTS?"
        ),
        "gridmem_worker_processes": "did you mean GRIDMEM_WORKER__PROCESSES?",
        "GRIDMEM_FROBNICATE": "see gridmem.example.toml",
    }
    assert len(said) == len(suggestions), said
    for (variable, suggestion), line in zip(sorted(suggestions.items()), said, strict=True):
        assert line.startswith(f"environment variable {variable} is not a gridmem setting")
        assert suggestion in line and "\n" not in line
    assert all(SECRET not in line for line in said)


def test_settings_load_warns_about_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GRIDMEM_REDIS_URL", "redis://h")
    with caplog.at_level(logging.WARNING, logger="gridmem.config"):
        settings = Settings.load()
    assert settings.redis.url is None
    [record] = [r for r in caplog.records if r.name == "gridmem.config"]
    assert record.levelno == logging.WARNING
    assert "GRIDMEM_REDIS_URL" in record.getMessage()
    assert "did you mean GRIDMEM_REDIS__URL?" in record.getMessage()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "demo"])
def test_serve_and_demo_warn_about_a_misspelt_variable(fresh: Path, command: str) -> None:
    env = _environment(
        GRIDMEM_REDIS_URL="redis://127.0.0.1:1/0", GRIDMEM_STORAGE_PATH="/proc/gridmem-nope"
    )
    done = _run([*GRIDMEM, command], fresh, env)
    warning, error = done.stderr.splitlines()
    assert "WARNING" in warning and "GRIDMEM_REDIS_URL" in warning, done.stderr
    assert "did you mean GRIDMEM_REDIS__URL?" in warning
    assert "storage_path /proc/gridmem-nope" in error and done.returncode == 2


# -- item 13: which Redis and which LLM, said at start ----------------------------------------


def test_the_endpoints_line_names_the_store_and_the_model() -> None:
    private = Settings(storage_path=Path("/srv/gm"))
    assert endpoints(private, "unix:///srv/gm/valkey/valkey.sock") == (
        "Redis: private Valkey on /srv/gm/valkey/valkey.sock; "
        "LLM: offline responder (no llm.base_url)"
    )
    external = Settings(
        redis={"url": f"redis://:{SECRET}@h:6379/0"},
        llm={"base_url": f"https://u:{SECRET}@api.example/v1?key={SECRET}", "model": "m1"},
    )
    assert endpoints(external, f"redis://:{SECRET}@h:6379/0") == (
        "Redis: redis://:***@h:6379/0 (redis.url); LLM: https://u:***@api.example/v1, model m1"
    )


class Serving:
    """`gridmem serve` in its own process group (as a terminal's job), output read with a
    deadline."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [*GRIDMEM, "serve"], cwd=cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.seen: list[str] = []
        self._output = OutputLines(self.process)

    def line_with(self, words: str) -> str:
        while True:
            line = self._output.next(DEADLINE)
            if line is None:
                raise AssertionError(f"no '{words}' line: {''.join(self.seen)}")
            self.seen.append(line)
            if words in line:
                return line

    def ctrl_c(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=DEADLINE)
        self.seen += self._output.finish(DEADLINE)  # it read to the end: the pipe can close
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.mark.slow
def test_serve_logs_the_private_store_and_the_llm_endpoint_it_uses(fresh: Path) -> None:
    """Regression (issue 13 item 13): nothing said which Redis or which model a service
    used, so a misspelt variable showed only as a private server starting."""
    env = _environment(
        GRIDMEM_WORKER__PROCESSES="1",
        GRIDMEM_LLM__BASE_URL=f"http://bot:{SECRET}@127.0.0.1:9/v1?key={SECRET}",
    )
    serving = Serving(fresh, env)
    try:
        line = serving.line_with("Redis: ")
    finally:
        serving.ctrl_c()
    socket = (fresh / "gridmem-data" / "valkey" / "valkey.sock").resolve()
    assert f"Redis: private Valkey on {socket}; " in line.replace(str(fresh), str(fresh.resolve()))
    assert "LLM: http://bot:***@127.0.0.1:9/v1, model gpt-4o-mini" in line
    assert SECRET not in "".join(serving.seen)
    assert serving.process.returncode == 0


@pytest.mark.slow
def test_serve_logs_an_external_store_without_its_password(fresh: Path) -> None:
    server = EmbeddedValkey(fresh / "external", extra_config={"requirepass": SECRET}).start()
    try:
        url = f"unix://:{SECRET}@{server.socket_path}"
        serving = Serving(
            fresh, _environment(GRIDMEM_WORKER__PROCESSES="1", GRIDMEM_REDIS__URL=url)
        )
        try:
            line = serving.line_with("Redis: ")
        finally:
            serving.ctrl_c()
    finally:
        server.stop()
    assert f"Redis: unix://:***@{server.socket_path} (redis.url); " in line
    assert "LLM: offline responder (no llm.base_url)" in line
    assert SECRET not in "".join(serving.seen) and serving.process.returncode == 0


# -- item 14: numeric flags, in words -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--residents", "abc"],
            "argument --residents: must be a positive whole number, got 'abc'",
        ),
        (
            ["--residents", "1.5"],
            "argument --residents: must be a positive whole number, got '1.5'",
        ),
        (["--residents", "0"], "argument --residents: must be at least 1, got '0'"),
        (["--processes", "-2"], "argument --processes: must be at least 1, got '-2'"),
        (["--processes", "65"], "argument --processes: must be at most 64, got '65'"),
        (["--seed", "x"], "argument --seed: must be a whole number, got 'x'"),
    ],
)
def test_demo_numeric_flags_say_what_is_wrong(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 13 item 14): `gridmem demo --residents abc` said
    `invalid _positive value: 'abc'`, the name of a Python function."""
    from worker.cli import main

    with pytest.raises(SystemExit) as done:
        main(["demo", *args])
    err = capsys.readouterr().err
    assert done.value.code == 2 and said in err and "_positive" not in err, err


@pytest.mark.parametrize(
    ("residents", "said"),
    [
        ("99999999999999", "must be at most 5000, got '99999999999999'"),
        ("\u0661\u0660", "must be a positive whole number, got '\u0661\u0660'"),
    ],
)
def test_demo_residents_out_of_reach_are_refused_before_anything_runs(
    residents: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 13, found by trying it): `gridmem demo --residents 99999999999999`
    (a few zeros too many) was taken as asked and filled the memory building residents
    before the first message; Arabic-Indic digits were read as a number. The parser is
    asked alone, so the old code's demo never starts here."""
    from worker.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["demo", "--residents", residents])
    err = capsys.readouterr().err
    assert done.value.code == 2 and f"argument --residents: {said}" in err, err


# -- the table itself, for the kinds the processes above do not meet ---------------------------


@pytest.mark.parametrize(
    ("exc", "status", "said"),
    [
        (redis_py.AuthenticationError("invalid username-password pair"), 2, "refused the credentials"),
        (redis_py.ResponseError("ERR unknown command 'FCALL'"), 1, "answered with an error"),
        (redis_py.TimeoutError("Timeout reading from socket"), 1, "cannot reach Redis at"),
        (OSError(98, "Address already in use"), 1, "Address already in use"),
        (FileNotFoundError(2, "No such file or directory", "/usr/bin/valkey-server"), 1,
         "cannot use No such file or directory: /usr/bin/valkey-server"),
        (PermissionError(13, "Permission denied", "/srv/gm/valkey"), 2,
         "storage_path /srv/gm (GRIDMEM_STORAGE_PATH) cannot be used: Permission denied"),
    ],
)  # fmt: skip
def test_each_kind_of_failure_has_its_status_and_words(
    exc: BaseException, status: int, said: str
) -> None:
    from worker.cli import Where
    from worker.cli import failure

    where = Where(f"redis://:{SECRET}@h:6379/0", Path("/srv/gm"))
    told = failure(exc, where)
    assert told is not None and told[0] == status and said in told[1], told
    assert SECRET not in told[1]


def test_a_bug_keeps_its_traceback() -> None:
    """Only what a person can act on is turned into a line; anything else is a bug."""
    from worker.cli import Where
    from worker.cli import failure

    assert failure(KeyError("x"), Where(None, Path("gridmem-data"))) is None
