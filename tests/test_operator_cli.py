"""bin/gridmem-cli through the real redis-cli / valkey-cli binaries, against a real server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from typing import NamedTuple

import pytest

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ReasonCode
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import cli_binary
from gridmem.keys import shard_tags
from tests.conftest import short_tempdir
from tests.helpers import OutputLines
from tests.helpers import avatar

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
    store = ConversationStore(server.client(), config)  # publishes its layout on its first write
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


def test_a_reader_that_goes_away_early_gets_no_traceback(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    """`gridmem-cli stats | head -1`: the pipe closes before the output is written;
    like any Unix tool, the CLI stops quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(CLI), "-s", str(server.socket_path), "stats"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            text=True,
            timeout=60,
            env={**os.environ, "GRIDMEM_REDIS_CLI": client_binary},
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


class Follower:
    """`gridmem-cli events --follow` in the background, read with a deadline: a hang fails."""

    def __init__(self, server: EmbeddedValkey, client: str, tmp: Path, *args: str) -> None:
        self.tmp = tmp
        env = {**os.environ, "GRIDMEM_REDIS_CLI": client, "TMPDIR": str(tmp)}
        self.process = subprocess.Popen(
            [str(CLI), "-s", str(server.socket_path), "events", "--follow", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self._output = OutputLines(self.process)

    def line(self, timeout: float = 30.0) -> str:
        """The next line printed; the follower polls once a second, so 30 s is ample."""
        line = self._output.next(timeout)
        if line is None:
            raise AssertionError(f"events --follow printed nothing within {timeout} s")
        return line

    def stop(self) -> str:
        """Stop it as Ctrl-C would; it must still have been running. Returns its stderr."""
        assert self.process.poll() is None, "events --follow exited on its own"
        self.process.terminate()
        self.process.wait(timeout=30)
        self._output.finish(30)
        assert self.process.stderr is not None and self.process.stdout is not None
        errors = self.process.stderr.read()
        self.process.stderr.close()
        self.process.stdout.close()
        return errors

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@contextmanager
def following(server: EmbeddedValkey, client: str, *args: str) -> Iterator[Follower]:
    """A Follower with a temporary directory of its own (its TMPDIR), both gone after."""
    tmp = short_tempdir("gm-follow-")
    follower = Follower(server, client, tmp, *args)
    try:
        yield follower
    finally:
        follower.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def test_events_and_follow(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    done = gm(server, client_binary, "events", "--count", "3", "--json")
    assert done.returncode == 0, done.stderr
    events = json.loads(done.stdout)  # one document, as every other command prints
    assert len(events) == 3 and all(e["reason"] == "compacted" for e in events)
    assert [e["id"] for e in events] == [e.id for e in store.events(count=1000)][-3:]
    table = gm(server, client_binary, "events")
    assert table.returncode == 0 and MARK not in table.stdout
    with following(server, client_binary, "--count", "1") as follower:
        assert "compacted" in follower.line()
        store.delete(B, "public")
        line = follower.line()  # arrives within the poll
        assert "deleted_operator" in line and B in line
        assert "Traceback" not in follower.stop()
        assert list(follower.tmp.iterdir()) == []  # its temporary file went with it


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
        ["frobnicate"], ["stats", "extra"], ["--shards", "3", "stats"], ["--namespace", "Not OK", "stats"],
        # integers: ASCII decimal digits only, a sequence number not negative
        ["events", "--count", "\u0661\u0660"], ["events", "--count", "0x10"], ["events", "--count", "+5"],
        ["events", "--count", "1e3"], ["events", "--count", " 5"], ["events", "--count", ""], ["events", "--count", "-"],
        ["sessions", "--limit", "\uff11"], ["transcript", A, "im", "--show-content", "--before", "-1"],
        # a count is never negative (issue 13 item 10: -5 was clamped to 1, silently)
        ["events", "--count", "-5"], ["events", "--count", "-0"], ["sessions", "--limit", "-1"],
        ["transcript", A, "im", "--show-content", "--limit", "-99999999999999999999"],
        # a URL scheme the clients cannot use (exit 1 before), a socket path no socket can have
        ["-u", "http://x", "stats"], ["-u", "valkey://127.0.0.1", "stats"], ["-s", "/" + "x" * 120, "stats"],
        ["transcript", A, "im", "--show-content", "--after", "-00000000000000000000001"],
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
        # found, not given: it says which server it used (issue 13 item 10)
        socket = storage / "valkey" / "valkey.sock"
        assert f"gridmem-cli: server: the private Valkey at {socket}" in ok.stderr
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
    for args, code in (
        (["sessions"], 0),
        (["stats"], 0),
        (["events", "--count", "100"], 0),
        (["--json", "sessions"], 0),
        (["--json", "stats"], 0),
        (["--json", "events"], 0),
        (["transcript", A, "im"], 2),
    ):
        done = gm(server, client_binary, *args)
        assert done.returncode == code, (args, done.stderr)  # each ran, or was refused
        outputs.append(done.stdout + done.stderr)
    assert all(out.strip() for out in outputs)
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


# -- the layout and limits the store published (issue 12 item 8) -------------------------

PEOPLE = [avatar(100 + n) for n in range(30)]


def _published_prefixes(server: EmbeddedValkey, namespace: str) -> list[str]:
    raw = server.client().hget(f"{namespace}:layout", namespace)
    assert raw is not None
    return list(raw.decode().split(" "))


def _avatars_by_shard(server: EmbeddedValkey, prefixes: list[str]) -> dict[int, list[str]]:
    """Which avatar's sessions live in which shard, read from the keys themselves."""
    found: dict[int, set[str]] = defaultdict(set)
    for raw in server.client().keys("*:meta"):
        key = raw.decode()
        [shard] = [n for n, p in enumerate(prefixes) if key.startswith(p)]
        found[shard].add(key[len(prefixes[shard]) + 2 :].split(":")[0])
    return {shard: sorted(found[shard]) for shard in sorted(found)}


def _sharded_store(server: EmbeddedValkey, shards: int, max_events: int) -> ConversationStore:
    """30 residents on IM, the first 6 on public chat too, in the default namespace (the CLI needs no --namespace)."""
    config = ConversationConfig(namespace="gm", shards=shards, limits=Limits(max_events=max_events))
    store = ConversationStore(server.client(), config)
    for who in PEOPLE:
        store.record(who, "im", AvatarMessage(text=f"{MARK} im"))
    for who in PEOPLE[:6]:
        store.record(who, "public", AvatarMessage(text=f"{MARK} public"))
    return store


@pytest.mark.parametrize("shards", [1, 3])
def test_six_deletes_leave_exactly_each_shards_share_of_max_events_in_every_shard(
    server: EmbeddedValkey, client_binary: str, shards: int
) -> None:
    """Regression: delete/expire trimmed the stream to a hard-coded 10,000, not max_events.
    Each shard's stream holds its share, max_events // shards (here 5), as the store
    trims it, so all shards together hold at most max_events."""
    # Given a store whose shards get 5 events each (max_events = 5 x shards + 1: the
    # remainder is dropped) and sessions in every shard (no --shards, no --namespace)
    store = _sharded_store(server, shards, max_events=5 * shards + shards - 1)
    prefixes = _published_prefixes(server, "gm")
    by_shard = _avatars_by_shard(server, prefixes)
    assert sorted(by_shard) == list(range(shards)) and min(map(len, by_shard.values())) >= 6
    # When the CLI ends six sessions of each shard (deletes and expiries)
    for who_all in by_shard.values():
        for i, who in enumerate(who_all[:6]):
            done = gm(server, client_binary, "delete" if i % 2 else "expire", who, "im")
            assert done.returncode == 0 and "session of" in done.stdout, done.stderr
            assert store.context(who, "im") == []
    # Then every shard's stream holds exactly its share, the newest
    client = server.client()
    for shard, prefix in enumerate(prefixes):
        who_all = by_shard[shard]
        kept = client.xrange(prefix + "events")
        assert len(kept) == 5
        assert [f[b"uuid"].decode() for _, f in kept] == who_all[1:6]


class ThreeShards(NamedTuple):
    store: ConversationStore
    prefixes: list[str]
    by_shard: dict[int, list[str]]
    deleted: set[str]  # avatars whose IM session the store deleted: two per shard
    live: set[tuple[str, str]]  # (avatar, channel) of every live session


@pytest.fixture
def three_shards(server: EmbeddedValkey) -> ThreeShards:
    """A 3-shard store with sessions in every shard, two of each shard deleted by the store."""
    store = _sharded_store(server, 3, max_events=50)
    prefixes = _published_prefixes(server, "gm")
    by_shard = _avatars_by_shard(server, prefixes)
    assert sorted(by_shard) == [0, 1, 2]
    for who_all in by_shard.values():
        for who in who_all[-2:]:
            assert store.delete(who, "im")
    deleted = {who for who_all in by_shard.values() for who in who_all[-2:]}
    live = {(who, "im") for who in PEOPLE if who not in deleted}
    live |= {(who, "public") for who in PEOPLE[:6]}
    return ThreeShards(store, prefixes, by_shard, deleted, live)


def test_sessions_and_stats_cover_every_shard(
    server: EmbeddedValkey, client_binary: str, three_shards: ThreeShards
) -> None:
    # sessions: every page, shard after shard, lists each live session once
    listed: list[tuple[str, str]] = []
    cursor: str | None = None
    while True:
        args = ["--json", "sessions", "--limit", "4"] + (["--cursor", cursor] if cursor else [])
        done = gm(server, client_binary, *args)
        assert done.returncode == 0, done.stderr
        page = json.loads(done.stdout)
        assert len(page["items"]) <= 4
        listed += [(i["avatar_uuid"], i["channel"]) for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(listed) == sorted(three_shards.live)
    # stats: the sum of every shard
    done = gm(server, client_binary, "--json", "stats")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    client = server.client()
    assert stats["shards"] == 3
    assert stats["sessions"] == {"public": 6, "im": len(PEOPLE) - len(three_shards.deleted)}
    assert stats["stored_bytes"] == sum(
        int(client.hget(p + "stats", "bytes")) for p in three_shards.prefixes
    )
    assert stats["events"] == {"deleted_operator": 6} and stats["limits"]["max_events"] == 50


def test_events_cover_every_shard(
    server: EmbeddedValkey, client_binary: str, three_shards: ThreeShards
) -> None:
    client = server.client()
    streams = [
        (n, entry_id.decode())
        for n, p in enumerate(three_shards.prefixes)
        for entry_id, _ in client.xrange(p + "events")
    ]
    done = gm(server, client_binary, "--json", "events", "--count", "100")
    assert done.returncode == 0, done.stderr
    events = json.loads(done.stdout)
    assert sorted((e["shard"], e["id"]) for e in events) == sorted(streams)
    assert {e["shard"] for e in events} == {0, 1, 2}
    assert {e["avatar_uuid"] for e in events} == three_shards.deleted
    order = [(*map(int, e["id"].split("-")), e["shard"]) for e in events]
    assert order == sorted(order)  # merged oldest first
    newest = gm(server, client_binary, "--json", "events", "--count", "4")
    assert json.loads(newest.stdout) == events[-4:]


def test_events_follow_every_shard(
    server: EmbeddedValkey, client_binary: str, three_shards: ThreeShards
) -> None:
    with following(server, client_binary, "--count", "1") as follower:
        assert "deleted_operator" in follower.line()
        last = [three_shards.by_shard[2][0], three_shards.by_shard[0][0]]
        for who in last:
            assert three_shards.store.expire(who, "im")
        lines = [follower.line(), follower.line()]
        assert all("expired_operator" in line for line in lines)
        assert {who for who in last for line in lines if who in line} == set(last)
        assert "Traceback" not in follower.stop()


@pytest.mark.parametrize(
    "args",
    [["sessions"], ["stats"], ["events"], ["delete", A, "im"], ["expire", A, "im"],
     ["transcript", A, "im", "--show-content"]],
)  # fmt: skip
def test_nothing_published_is_a_clear_error(
    server: EmbeddedValkey, client_binary: str, args: list[str]
) -> None:
    server.client().flushall()  # a server no store has written to
    done = gm(server, client_binary, *args)
    assert done.returncode == 1
    assert "no gridmem store with namespace 'gm' has published its layout" in done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_several_stores_on_one_server(server: EmbeddedValkey, client_binary: str) -> None:
    for namespace, shards, talkers in (("one", 1, 1), ("two", 2, 3)):
        store = ConversationStore(
            server.client(), ConversationConfig(namespace=namespace, shards=shards)
        )
        for n in range(talkers):
            store.record(avatar(n), "im", AvatarMessage(text="hi"))
    # the default namespace (gm) has published nothing here: the error says how to pick one
    unsure = gm(server, client_binary, "stats")
    assert unsure.returncode == 1 and "--namespace" in unsure.stderr and "'gm'" in unsure.stderr
    for namespace, talkers, shards in (("one", 1, 1), ("two", 3, 2)):
        done = gm(server, client_binary, "--namespace", namespace, "--json", "stats")
        assert done.returncode == 0, done.stderr
        stats = json.loads(done.stdout)
        assert stats["sessions"]["im"] == talkers and stats["shards"] == shards
    unknown = gm(server, client_binary, "--namespace", "three", "stats")
    assert unknown.returncode == 1 and "namespace 'three' has published" in unknown.stderr


@pytest.mark.parametrize(
    ("asked", "got"),
    [
        ("010", 10),  # decimal ten, not octal eight
        ("08", 8),  # not an octal error
        ("09", 9),
        ("0000000000000000000000000003", 3),  # zeros are dropped before the digits count
        ("0", 1),  # clamped up to 1 (a negative one is refused: issue 13 item 10)
    ],
)
def test_integer_arguments_are_decimal(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str, asked: str, got: int
) -> None:
    """Regression (issue 12 item 8, second pass): bash arithmetic read --count 010 as
    octal 8, refused 08 with a bash error (exit 1), and wrapped past 2^63."""
    assert len(store.events(count=1000)) > 10
    done = gm(server, client_binary, "events", "--count", asked, "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == got


@pytest.mark.parametrize("digits", [16, 19, 20, 21, 40])
def test_a_count_of_more_than_15_digits_saturates(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str, digits: int
) -> None:
    """A count past bash's 64 bits (or just long) means the most there is, never a wrapped
    value: 9,223,372,036,854,775,808 wrapped to a negative count, clamped to 1."""
    every = len(store.events(count=1000))
    for asked in ("9" * digits, "1" + "0" * (digits - 1), "9223372036854775808"):
        done = gm(server, client_binary, "events", "--count", asked, "--json")
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)) == every, asked


def test_sequence_anchors_are_decimal_and_saturate(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    seqs = [t.seq for t in _walk_store(store)]
    assert len(seqs) > 12 and seqs[0] < 8

    def page(*args: str) -> list[int]:
        done = gm(server, client_binary, "transcript", A, "im", "--show-content", "--json", *args)
        assert done.returncode == 0, done.stderr
        return [t["seq"] for t in json.loads(done.stdout)["turns"]]

    # 08 and 010 are eight and ten (08 was a bash error, 010 eight)
    assert page("--before", "08", "--limit", "200") == [s for s in seqs if s < 8]
    assert page("--after", "010", "--limit", "010") == [s for s in seqs if s > 10][:10]
    # past 15 digits: the largest sequence there can be, so after it nothing, before it
    # the newest page
    huge = "9" * 25
    assert page("--after", huge) == []
    assert page("--before", huge, "--limit", "5") == seqs[-5:]
    assert page("--before", "0" * 30 + "12", "--limit", "200") == [s for s in seqs if s < 12]


def test_namespace_default_is_documented() -> None:
    """--namespace defaults to $GRIDMEM_CONVERSATION__NAMESPACE, else gm: in --help and
    docs/operations.md."""
    top = subprocess.run(check=False, args=[str(CLI), "--help"], capture_output=True, text=True)
    assert (
        "--namespace NS       the store's namespace (default: $GRIDMEM_CONVERSATION__NAMESPACE or gm)"
        in top.stdout
    )
    assert "decimal" in top.stdout
    docs = (ROOT / "docs" / "operations.md").read_text()
    assert (
        "The namespace is `gm` unless `--namespace` (or\n`GRIDMEM_CONVERSATION__NAMESPACE`" in docs
    )


def test_a_resident_cannot_forge_transcript_lines(
    server: EmbeddedValkey, client_binary: str
) -> None:
    """Regression (issue 12, attack pass on the operator surface): a resident's
    newlines printed as lines of their own, so a message could show the operator a
    forged `#999 ... agent:` turn and a fake `more:` footer; bidi controls were
    printed raw and could reorder the line."""
    # Given a resident who types a fake agent turn, a fake footer and a bidi override
    who = avatar(77)
    store = ConversationStore(server.client(), ConversationConfig())
    forged = "hi\n#999  2026-12-01 06:55:26  agent: I will pay you L$10000\n\nmore: --before 1"
    store.record(who, "public", AvatarMessage(text=forged + " \u202ereversed\u202c"))
    # When an operator reads the transcript as text
    out = gm(server, client_binary, "transcript", who, "public", "--show-content").stdout
    lines = out.splitlines()
    # Then every line of the resident's words is marked as a continuation of its turn
    assert [line for line in lines if line.startswith("#")] == [lines[0]], out
    assert not any(line.startswith("more:") for line in lines), out
    assert "agent: I will pay you L$10000" in out  # still shown, inside the avatar's turn
    assert "\u202e" not in out and "\\u202e" in out
    # And the JSON view keeps the words as stored
    page = json.loads(
        gm(server, client_binary, "transcript", who, "public", "--show-content", "--json").stdout
    )
    assert page["turns"][0]["text"].startswith(forged)


# -- issue 13 item 10: rough edges a newcomer meets ----------------------------------------------


def test_json_events_is_one_document_and_an_empty_list_when_there_are_none(
    server: EmbeddedValkey, client_binary: str
) -> None:
    """Regression (issue 13 item 10): `--json events` printed nothing when there were no
    events, and one object per line when there were, while every other command prints
    one document."""
    ConversationStore(server.client()).publish_limits()  # a store, and no event yet
    done = gm(server, client_binary, "--json", "events")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    store = ConversationStore(server.client())
    store.record(A, "im", AvatarMessage(text="hi"))
    store.delete(A, "im")
    [event] = json.loads(gm(server, client_binary, "--json", "events").stdout)
    assert event["reason"] == "deleted_operator" and event["avatar_uuid"] == A


def test_json_events_follow_prints_one_object_per_line(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    """A followed stream has no end, so --follow --json stays JSON Lines (documented)."""
    with following(server, client_binary, "--count", "2", "--json") as follower:
        first = [json.loads(follower.line()), json.loads(follower.line())]
        assert all(isinstance(e, dict) and e["reason"] == "compacted" for e in first)
        store.delete(B, "public")
        assert json.loads(follower.line())["reason"] == "deleted_operator"
        assert "Traceback" not in follower.stop()


def test_json_transcript_has_no_next_anchor_on_its_last_page(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    """Regression (issue 13 item 10): `"has_more": false, "next_anchor": 1` read as a
    page to go on to."""
    base = ["transcript", A, "im", "--show-content", "--json"]
    every = json.loads(gm(server, client_binary, *base, "--limit", "200").stdout)
    assert every["has_more"] is False and every["next_anchor"] is None and every["turns"]
    page = json.loads(gm(server, client_binary, *base, "--limit", "3").stdout)
    assert page["has_more"] is True and page["next_anchor"] == page["turns"][0]["seq"]
    last = json.loads(gm(server, client_binary, *base, "--after", "0", "--limit", "200").stdout)
    assert last["has_more"] is False and last["next_anchor"] is None


def test_one_session_is_one_session(server: EmbeddedValkey, client_binary: str) -> None:
    """Regression (issue 13 item 10): "1 sessions"."""
    ConversationStore(server.client()).record(A, "im", AvatarMessage(text="hi"))
    assert "\n1 session; end" in gm(server, client_binary, "sessions").stdout
    ConversationStore(server.client()).record(B, "im", AvatarMessage(text="hi"))
    assert "\n2 sessions; end" in gm(server, client_binary, "sessions").stdout


def test_clamping_is_said_in_help_and_on_stderr(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    """Regression (issue 13 item 10): --limit and --count were clamped silently while
    --help gave no range; clamping is the contract of transcript pages, so it stays,
    said in --help and on stderr when it happens."""
    for command in ("sessions", "events", "transcript"):
        help_text = gm(None, client_binary, command, "--help").stdout
        assert "clamped to 1 .. the store's largest" in help_text and "negative refused" in (
            help_text
        ), help_text
    wide = gm(server, client_binary, "transcript", A, "im", "--show-content", "--limit", "5000")
    assert wide.returncode == 0
    assert "gridmem-cli: --limit 5000 is outside 1..200 (the store's bounds): using 200" in (
        wide.stderr
    )
    quiet = gm(server, client_binary, "events", "--count", "3")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_it_says_which_server_it_talks_to(
    server: EmbeddedValkey, store: ConversationStore, client_binary: str
) -> None:
    """Regression (issue 13 item 10): with no socket under ./gridmem-data the CLI asked
    127.0.0.1:6379 silently and listed another store's sessions. Now a server it was
    not given on the command line is named on stderr, -v names any, and with none it
    stops (tests/test_cli_errors.py: cli-no-server-here)."""
    told = gm(server, client_binary, "-v", "--json", "stats")
    assert told.returncode == 0 and json.loads(told.stdout)["sessions"]["im"] == 1
    assert told.stderr == f"gridmem-cli: server: unix socket {server.socket_path} (--socket)\n"
    assert gm(server, client_binary, "stats").stderr == ""  # given on the command line
    # a unix:// URL works (redis-cli and valkey-cli refuse it as -u), from the
    # environment too, as gridmem serve reads it
    url = f"unix://{server.socket_path}"
    by_url = gm(None, client_binary, "-u", url, "--json", "stats")
    assert by_url.returncode == 0 and by_url.stderr == "", by_url.stderr
    from_env = gm(None, client_binary, "--json", "stats", env={"GRIDMEM_REDIS__URL": url})
    assert from_env.returncode == 0 and json.loads(from_env.stdout)["sessions"]["im"] == 1
    assert from_env.stderr == (
        f"gridmem-cli: server: unix socket {server.socket_path} ($GRIDMEM_REDIS__URL)\n"
    )


# -- key names only from the published templates (issue 14 item 5) ----------------------


def _ops_store(server: EmbeddedValkey) -> tuple[ConversationStore, dict[int, list[str]]]:
    """A 3-shard store in namespace 'ops' (not the default) with IM sessions in every shard."""
    store = ConversationStore(server.client(), ConversationConfig(namespace="ops", shards=3))
    for who in PEOPLE[:12]:
        store.record(who, "im", AvatarMessage(text=f"{MARK} of {who}"))
    by_shard = _avatars_by_shard(server, _published_prefixes(server, "ops"))
    assert sorted(by_shard) == [0, 1, 2]
    return store, by_shard


def test_the_cli_follows_the_key_templates_the_store_published(
    server: EmbeddedValkey, client_binary: str
) -> None:
    store, by_shard = _ops_store(server)
    client = server.client()
    ops = ("--namespace", "ops")
    who = by_shard[1][0]
    shown = gm(server, client_binary, *ops, "transcript", who, "im", "--show-content")
    assert shown.returncode == 0 and f"{MARK} of {who}" in shown.stdout, shown.stderr
    one, two = (f"ops:{{{tag}}}:" for tag in shard_tags(3)[1:])  # shards 1 and 2's prefixes
    # Given the session's transcript moved to a key name the CLI cannot guess
    moved = f"{one}elsewhere:{who}:im:turns"
    client.rename(f"{one}s:{who}:im:turns", moved)
    lost = gm(server, client_binary, *ops, "transcript", who, "im", "--show-content")
    assert lost.returncode == 0 and MARK not in lost.stdout, lost.stderr
    # When shard 1 publishes that template, the CLI reads the transcript there
    client.hset(f"{one}limits", "key_turns", f"{one}elsewhere:<uuid>:<channel>:turns")
    found = gm(server, client_binary, *ops, "transcript", who, "im", "--show-content")
    assert found.returncode == 0 and f"{MARK} of {who}" in found.stdout, found.stderr
    # and deletes it there, whole
    deleted = gm(server, client_binary, *ops, "delete", who, "im")
    assert deleted.returncode == 0 and "deleted the im session" in deleted.stdout
    assert not client.exists(moved) and store.context(who, "im") == []
    # An event stream under another published name is the one `events` reads
    client.xadd(f"{two}other-events", {"reason": "expired_operator", "uuid": by_shard[2][0]})
    client.hset(f"{two}limits", "key_events", f"{two}other-events")
    events = json.loads(gm(server, client_binary, *ops, "--json", "events", "--count", "50").stdout)
    assert [e["avatar_uuid"] for e in events if e["shard"] == 2] == [by_shard[2][0]]
    assert {e["shard"] for e in events} == {1, 2}  # shard 1's delete, shard 2's planted one


def test_a_missing_template_is_a_clear_error(server: EmbeddedValkey, client_binary: str) -> None:
    _, by_shard = _ops_store(server)
    zero = f"ops:{{{shard_tags(3)[0]}}}:"  # shard 0's prefix
    server.client().hdel(f"{zero}limits", "key_meta")
    done = gm(server, client_binary, "--namespace", "ops", "delete", by_shard[0][0], "im")
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "gridmem-cli: store 'ops' has published no key name 'meta' for shard 0: "
        "run its store or service (this version) once"
    ]
    assert server.client().exists(f"{zero}s:{by_shard[0][0]}:im:meta")  # nothing deleted


def test_the_script_builds_no_key_name_and_uses_no_gnu_date() -> None:
    script = CLI.read_text()
    assert "%3N" not in script and "date +" not in script
    assert (
        ":s:" not in script
        and "lru:" not in script
        and "}limits" not in script.replace('"${prefix}limits"', "")
    )  # the one name it builds: where a shard's published limits hash is


def test_it_needs_bash_5_and_says_so(tmp_path: Path) -> None:
    assert (
        "bash 5.0 or newer"
        in subprocess.run([str(CLI), "--help"], capture_output=True, text=True, check=True).stdout
    )
    assert "bash 5.0 or newer" in (ROOT / "docs" / "operations.md").read_text()
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell is not None
    done = subprocess.run([shell, str(CLI), "stats"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("gridmem-cli: needs bash 5.0 or newer (this is not bash)")
