"""bin/gridmem-cli through the real redis-cli / valkey-cli binaries, against a real server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import short_tempdir
from tests.helpers import avatar
from worker import (
    AgentReply,
    AvatarMessage,
    ConversationConfig,
    ConversationStore,
    Limits,
    ReasonCode,
    ToolSummary,
)
from worker.embedded import EmbeddedValkey, cli_binary

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "bin" / "gridmem-cli"
CLIENTS = {"valkey-cli": cli_binary()}
if shutil.which("redis-cli"):
    CLIENTS["redis-cli"] = str(shutil.which("redis-cli"))
A, B = avatar(1), avatar(2)
MARK = "PAPAYA-MARKER"


@pytest.fixture(params=list(CLIENTS))
def client_binary(request: pytest.FixtureRequest) -> str:
    return CLIENTS[str(request.param)]


@pytest.fixture
def server(real_servers: dict[str, EmbeddedValkey]) -> EmbeddedValkey:
    real_servers["valkey"].client().flushall()
    return real_servers["valkey"]


@pytest.fixture
def store(server: EmbeddedValkey) -> ConversationStore:
    config = ConversationConfig(archive_enabled=True, limits=Limits(max_turns_per_session=8))
    store = ConversationStore(server.client(), config)
    store.publish_limits()
    for i in range(30):
        store.record(A, "im", AvatarMessage(text=f"{MARK} {i} password=hunter22"))
        store.record(A, "im", AgentReply(text=f"{MARK} reply {i}"))
    store.record(B, "public", ToolSummary(tool="web", summary=f"{MARK} tool"))
    return store


def gm(
    server: EmbeddedValkey | None, client: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    connection = ["-s", str(server.socket_path)] if server else []
    return subprocess.run(
        [str(CLI), *connection, *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env={**os.environ, "GRIDMEM_REDIS_CLI": client, **(env or {})},
    )


def test_sessions_table_json_and_paging(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    table = gm(server, client_binary, "sessions")
    assert table.returncode == 0, table.stderr
    assert A in table.stdout and B in table.stdout and "2 sessions; end" in table.stdout
    assert MARK not in table.stdout
    first = json.loads(gm(server, client_binary, "--json", "sessions", "--limit", "1").stdout)
    assert len(first["items"]) == 1 and first["next_cursor"] == f"0:{A}:im"
    second = json.loads(
        gm(
            server,
            client_binary,
            "sessions",
            "--limit",
            "1",
            "--cursor",
            first["next_cursor"],
            "--json",
        ).stdout
    )
    assert [i["avatar_uuid"] for i in second["items"]] == [B] and second["next_cursor"] is None
    assert {i["session_id"] for i in first["items"] + second["items"]} == {
        m.session_id for m in store.list_metadata().items
    }


def test_stats(server: EmbeddedValkey, store: ConversationStore, client_binary: str) -> None:
    result = json.loads(gm(server, client_binary, "stats", "--json").stdout)
    assert result["sessions"] == {"public": 1, "im": 1}
    assert result["stored_bytes"] == store.stats().stored_bytes > 0
    assert result["redactions"] == 30 and result["events"]["compacted"] >= 1
    assert result["limits"]["max_turns_per_session"] == 8
    table = gm(server, client_binary, "stats").stdout
    assert "sessions" in table and "of 10,000" in table and MARK not in table


def test_events_and_follow(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    lines = gm(server, client_binary, "events", "--count", "3", "--json").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 3 and all(e["reason"] == "compacted" for e in events)
    assert [e["id"] for e in events] == [e.id for e in store.events(count=1000)][-3:]
    assert MARK not in gm(server, client_binary, "events").stdout
    follower = subprocess.Popen(
        [str(CLI), "-s", str(server.socket_path), "events", "--follow", "--count", "1"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "GRIDMEM_REDIS_CLI": client_binary},
    )  # fmt: skip
    try:
        assert "compacted" in (follower.stdout.readline() if follower.stdout else "")
        store.delete(B, "public")
        line = follower.stdout.readline() if follower.stdout else ""  # arrives within the poll
        assert "deleted_operator" in line and B in line
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout:
            follower.stdout.close()


@pytest.mark.parametrize(
    ("command", "reason"),
    [("delete", ReasonCode.DELETED_OPERATOR), ("expire", ReasonCode.EXPIRED_OPERATOR)],
)
def test_delete_and_expire(
    server: EmbeddedValkey,
    store: ConversationStore,
    client_binary: str,
    command: str,
    reason: ReasonCode,
) -> None:
    done = gm(server, client_binary, command, A.upper(), "im")
    assert (
        done.returncode == 0
        and f"the im session of {A}" in done.stdout
        and reason.value in done.stdout
    )
    assert store.context(A, "im") == []
    assert store.events(count=1000)[-1].reason is reason
    again = json.loads(gm(server, client_binary, "--json", command, A, "im").stdout)
    assert again == {"removed": False, "avatar_uuid": A, "channel": "im", "event": None}


def test_transcript_needs_show_content(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    refused = gm(server, client_binary, "transcript", A, "im")
    assert refused.returncode == 2 and "--show-content" in refused.stderr
    assert MARK not in refused.stdout + refused.stderr
    shown = gm(server, client_binary, "transcript", A, "im", "--show-content", "--limit", "4")
    assert (
        shown.returncode == 0 and shown.stdout.count(MARK) == 4 and "more: --before" in shown.stdout
    )
    assert "hunter22" not in shown.stdout  # stored redacted


def test_transcript_pages_archive_and_live_both_ways(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    expected = [t.seq for t in _walk_store(store)]
    assert len(expected) > 8  # the archive holds most of them
    for direction, flag in (("backward", "--before"), ("forward", "--after")):
        seqs: list[int] = []
        anchor: int | None = None
        while True:
            args = ["transcript", A, "im", "--show-content", "--json", "--limit", "7"]
            if anchor is not None:
                args += [flag, str(anchor)]
            elif direction == "forward":
                args += ["--after", "0"]
            page = json.loads(gm(server, client_binary, *args).stdout)
            got = [t["seq"] for t in page["turns"]]
            seqs = seqs + got if direction == "forward" else got + seqs
            if not page["has_more"]:
                break
            anchor = page["next_anchor"]
        assert seqs == expected


def _walk_store(store: ConversationStore) -> list[Any]:
    turns: list[Any] = []
    anchor = None
    while True:
        page = store.read_page(A, "im", anchor=anchor, direction="forward", limit=200)
        turns += page.turns
        if not page.has_more:
            return turns
        anchor = page.next_anchor


@pytest.mark.parametrize(("asked", "got"), [("0", 1), ("1", 1), ("200", 200), ("201", 200)])
def test_transcript_limit_is_clamped(
    server: EmbeddedValkey, client_binary: str, asked: str, got: int
) -> None:
    store = ConversationStore(
        server.client(), ConversationConfig(limits=Limits(max_turns_per_session=300))
    )
    for i in range(210):
        store.record(A, "im", AvatarMessage(text=f"t{i}"))
    page = json.loads(
        gm(
            server,
            client_binary,
            "transcript",
            A,
            "im",
            "--show-content",
            "--json",
            "--limit",
            asked,
        ).stdout
    )
    assert len(page["turns"]) == got


@pytest.mark.parametrize(
    "args",
    [
        ["delete", "not-a-uuid", "im"], ["expire", A, "group"], ["delete", A], ["transcript", A, "conference", "--show-content"],
        ["transcript", A, "im", "--show-content", "--before", "x"], ["transcript", A, "im", "--before", "1", "--after", "2", "--show-content"],
        ["sessions", "--limit", "many"], ["sessions", "--cursor", "garbage"], ["events", "--count", "lots"],
        ["frobnicate"], ["stats", "extra"],
    ],
)  # fmt: skip
def test_bad_input_exits_2_without_touching_the_server(
    client_binary: str, tmp_path: Path, args: list[str]
) -> None:
    # a socket that does not exist: any attempt to connect would exit 1, not 2
    done = subprocess.run(
        [str(CLI), "-s", str(tmp_path / "none.sock"), *args],
        capture_output=True,
        check=False,
        text=True,
        env={**os.environ, "GRIDMEM_REDIS_CLI": client_binary},
    )
    assert done.returncode == 2, (args, done.stderr)
    assert "gridmem-cli:" in done.stderr and "Could not connect" not in done.stderr


def test_unreachable_server_exits_1(client_binary: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(CLI), "-s", str(tmp_path / "none.sock"), "stats"],
        capture_output=True,
        check=False,
        text=True,
        env={**os.environ, "GRIDMEM_REDIS_CLI": client_binary},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "command", ["sessions", "stats", "events", "delete", "expire", "transcript"]
)
def test_every_command_has_help(command: str) -> None:
    done = subprocess.run(
        check=False, args=[str(CLI), command, "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and f"usage: gridmem-cli {command}" in done.stdout
    top = subprocess.run(check=False, args=[str(CLI), "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and command in top.stdout


def test_finds_the_private_server_and_honours_rediscli_auth(client_binary: str) -> None:
    storage = short_tempdir("gm-auth-")
    server = EmbeddedValkey(storage / "valkey", extra_config={"requirepass": "s3cret-pass"}).start()
    try:
        store = ConversationStore(server.client(password="s3cret-pass"))
        store.record(A, "im", AvatarMessage(text="x"))
        env = {"GRIDMEM_REDIS_CLI": client_binary, "GRIDMEM_STORAGE_PATH": str(storage)}
        ok = subprocess.run(
            [str(CLI), "--json", "stats"],
            capture_output=True,
            check=False,
            text=True,
            env={**os.environ, **env, "REDISCLI_AUTH": "s3cret-pass"},
        )
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["sessions"]["im"] == 1
        denied = subprocess.run(
            [str(CLI), "stats"],
            capture_output=True,
            check=False,
            text=True,
            env={**os.environ, **env},
        )
        assert denied.returncode == 1
    finally:
        server.stop()
        shutil.rmtree(storage, ignore_errors=True)


def test_no_command_prints_content_without_show_content(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    outputs = []
    for args in (
        ["sessions"],
        ["stats"],
        ["events", "--count", "100"],
        ["--json", "sessions"],
        ["--json", "stats"],
        ["--json", "events"],
        ["transcript", A, "im"],
    ):
        done = gm(server, client_binary, *args)
        outputs.append(done.stdout + done.stderr)
    assert all(MARK not in out and "hunter22" not in out for out in outputs)


def _acl_recipes() -> dict[str, list[str]]:
    """The ACL SETUSER lines docs/operations.md gives, by user name."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    lines = [line.split() for line in doc.splitlines() if line.startswith("ACL SETUSER")]
    return {words[2]: words[2:] for words in lines}


def test_documented_acl_users_get_what_the_docs_say(client_binary: str) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = short_tempdir("gm-acl-")
    server = EmbeddedValkey(directory, port=port).start()
    try:
        admin = server.client()
        store = ConversationStore(admin)
        store.record(A, "im", AvatarMessage(text=f"{MARK} private words"))
        recipes = _acl_recipes()
        assert set(recipes) == {"gridmem-viewer", "gridmem-operator"}
        for user, words in recipes.items():
            admin.execute_command(
                "ACL", "SETUSER", *[w.replace("CHANGE-ME", "pw-" + user) for w in words]
            )

        def as_user(user: str, *args: str) -> subprocess.CompletedProcess[str]:
            url = f"redis://{user}:pw-{user}@127.0.0.1:{port}"
            return subprocess.run(
                [str(CLI), "-u", url, *args],
                capture_output=True,
                check=False,
                text=True,
                env={**os.environ, "GRIDMEM_REDIS_CLI": client_binary},
            )

        for args in (["sessions"], ["stats"], ["events"]):
            seen = as_user("gridmem-viewer", *args)
            assert seen.returncode == 0, (args, seen.stderr)
        assert A in as_user("gridmem-viewer", "sessions").stdout
        refused = as_user("gridmem-viewer", "transcript", A, "im", "--show-content")
        assert refused.returncode == 1 and MARK not in refused.stdout
        assert as_user("gridmem-viewer", "delete", A, "im").returncode == 1
        assert store.context(A, "im")  # still there
        shown = as_user("gridmem-operator", "transcript", A, "im", "--show-content")
        assert shown.returncode == 0 and MARK in shown.stdout
        assert as_user("gridmem-operator", "delete", A, "im").returncode == 0
        assert store.context(A, "im") == []
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
