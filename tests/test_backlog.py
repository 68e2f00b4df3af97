"""gridmem/backlog.py: the private Valkey's stream backlog, saved to disk and added back.

Against a real server (XADD at explicit IDs and XINFO STREAM as Valkey does them).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from gridmem import AsyncConversationStore
from gridmem import backlog
from gridmem import connect_async
from gridmem import partition_of
from gridmem.config import Limits
from gridmem.config import Settings
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import final_flush
from gridmem.executor import Executor
from gridmem.keys import KeySpace
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.snapshots import HEADER_SIZE
from gridmem.snapshots import SnapshotDirectory
from gridmem.snapshots import parse_header
from tests.helpers import avatar

pytestmark = pytest.mark.real

SERVICE = KeySpace("gm", 1).service()
SERVICES = (SERVICE,)
PASSWORD = "password=Hunter2Hunter2Zq9"
API_KEY = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
MAX = Limits().max_input_bytes


def _directory(tmp_path: Path) -> SnapshotDirectory:
    return SnapshotDirectory(tmp_path / "conversations", Limits(), DEFAULT_REDACTOR)


def _fill(client: redis_py.Redis) -> tuple[list[str], list[str]]:
    inbound = [
        client.xadd(
            SERVICE.inbound,
            {
                "avatar_uuid": avatar(n),
                "channel": "im",
                "text": f"hi {n}, my {PASSWORD} and {API_KEY}",
                "avatar_name": f"Ann {API_KEY}",
            },
        ).decode()
        for n in range(5)
    ]
    outbound = [
        client.xadd(
            SERVICE.outbound,
            {
                "avatar_uuid": avatar(n),
                "channel": "im",
                "text": f"hello {n}",
                "in_reply_to": "1-1",
                "session_id": "ab" * 16,
            },
        ).decode()
        for n in range(3)
    ]
    return inbound, outbound


def _saved(client: redis_py.Redis, tmp_path: Path) -> tuple[SnapshotDirectory, Path]:
    """A snapshot directory holding the backlog of freshly filled streams, and its file."""
    directory = _directory(tmp_path)
    _fill(client)
    _save(client, directory)
    return directory, directory.directory / backlog.BACKLOG_FILE


def _save(client: redis_py.Redis, directory: SnapshotDirectory) -> backlog.SaveReport:
    return backlog.save(Executor(client), directory, SERVICES, created_ms=1)


def _restore(client: redis_py.Redis, directory: SnapshotDirectory) -> backlog.RestoreReport:
    return backlog.restore(Executor(client), directory, SERVICES, max_value_bytes=MAX, now_ms=7)


def _ids(client: redis_py.Redis, key: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(key)]


def test_round_trip_keeps_ids_redacts_and_deletes_the_file(
    real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    directory = _directory(tmp_path)
    inbound, outbound = _fill(real_redis)
    saved = _save(real_redis, directory)
    assert (saved.inbound, saved.outbound, saved.dropped) == (5, 3, 0)
    path = directory.directory / backlog.BACKLOG_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = path.read_bytes()
    for secret in ("Hunter2Hunter2Zq9", API_KEY, "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"):
        assert secret.encode() not in data
    real_redis.flushall()  # the server stopped; a new one is empty
    restored = _restore(real_redis, directory)
    assert (restored.inbound, restored.outbound, restored.skipped) == (5, 3, 0)
    assert restored.quarantined is None
    assert _ids(real_redis, SERVICE.inbound) == inbound
    assert _ids(real_redis, SERVICE.outbound) == outbound
    _, fields = real_redis.xrange(SERVICE.inbound)[0]
    assert fields[b"avatar_uuid"] == avatar(0).encode() and fields[b"channel"] == b"im"
    assert fields[b"text"].startswith(b"hi 0, my ") and API_KEY.encode() not in fields[b"text"]
    assert not path.exists()  # never replayed twice
    assert _restore(real_redis, directory).found is False


def test_restoring_into_a_stream_that_holds_them_adds_nothing(
    real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    directory = _directory(tmp_path)
    _fill(real_redis)
    _save(real_redis, directory)
    # one answered meanwhile: deleted, its ID below the stream's last one
    first = real_redis.xrange(SERVICE.inbound)[0][0]
    real_redis.xdel(SERVICE.inbound, first)
    restored = _restore(real_redis, directory)
    assert (restored.inbound, restored.outbound, restored.skipped) == (0, 0, 8)
    assert real_redis.xlen(SERVICE.inbound) == 4 and real_redis.xlen(SERVICE.outbound) == 3


@pytest.mark.parametrize("where", ["header", "payload", "last"])
def test_a_tampered_byte_is_quarantined_and_adds_nothing(
    real_redis: redis_py.Redis, tmp_path: Path, where: str
) -> None:
    directory, path = _saved(real_redis, tmp_path)
    data = bytearray(path.read_bytes())
    at = {"header": 20, "payload": HEADER_SIZE + 30, "last": len(data) - 2}[where]
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    real_redis.flushall()
    restored = _restore(real_redis, directory)
    assert restored.quarantined is not None
    assert (restored.inbound, restored.outbound) == (0, 0)
    assert real_redis.xlen(SERVICE.inbound) == 0 and real_redis.xlen(SERVICE.outbound) == 0
    assert not path.exists()
    assert (directory.directory / "quarantine" / "backlog.7").exists()


@pytest.mark.parametrize("keep", [10, HEADER_SIZE + 40])
def test_a_truncated_file_is_quarantined(
    real_redis: redis_py.Redis, tmp_path: Path, keep: int
) -> None:
    directory, path = _saved(real_redis, tmp_path)
    path.write_bytes(path.read_bytes()[:keep])
    real_redis.flushall()
    restored = _restore(real_redis, directory)
    assert restored.quarantined == "truncated"
    assert real_redis.xlen(SERVICE.inbound) == 0
    assert (directory.directory / "quarantine" / "backlog.7").exists()


def test_an_entry_that_is_not_utf8_or_has_unknown_fields_is_not_saved(
    real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    directory = _directory(tmp_path)
    real_redis.xadd(SERVICE.inbound, {"avatar_uuid": avatar(1), "channel": "im", "text": b"\xff"})
    real_redis.xadd(SERVICE.inbound, {"avatar_uuid": avatar(1), "channel": "im", "txt": "typo"})
    kept = real_redis.xadd(
        SERVICE.inbound, {"avatar_uuid": avatar(2), "channel": "im", "text": "ok"}
    )
    saved = _save(real_redis, directory)
    assert (saved.inbound, saved.dropped) == (1, 2)
    real_redis.flushall()
    _restore(real_redis, directory)
    assert _ids(real_redis, SERVICE.inbound) == [kept.decode()]


def test_empty_streams_leave_no_file(real_redis: redis_py.Redis, tmp_path: Path) -> None:
    directory = _directory(tmp_path)
    _fill(real_redis)
    _save(real_redis, directory)
    real_redis.flushall()
    saved = _save(real_redis, directory)
    assert saved.bytes == 0
    assert not (directory.directory / backlog.BACKLOG_FILE).exists()


def test_a_snapshot_key_from_elsewhere_is_refused(
    real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    """A file signed by another installation (or re-signed by anything without this
    key) never becomes input."""
    directory = _directory(tmp_path)
    _fill(real_redis)
    _save(real_redis, directory)
    (directory.directory / "snapshot.key").write_text("00" * 32)
    real_redis.flushall()
    restored = _restore(real_redis, directory)
    assert restored.quarantined == "signature_mismatch"
    assert real_redis.xlen(SERVICE.inbound) == 0


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (b'{"stream":"inbound","id":"5-0","fields":{"txt":"typo"}}\n', "bad_field"),
        (b'{"stream":"inbound","id":"0-0","fields":{"text":"hi"}}\n', "bad_id"),
        (b'{"stream":"inbound","id":"5-x","fields":{"text":"hi"}}\n', "bad_id"),
        (b'{"stream":"dead","id":"5-0","fields":{"text":"hi"}}\n', "bad_entry"),
        (b'{"stream":"inbound","id":"5-0","fields":{"text":7}}\n', "bad_field"),
        (b'{"stream":"outbound","id":"5-0","fields":{"text":"hi"}}\n', "bad_field"),
        (b"not json\n", "bad_line"),
        (
            b'{"stream":"inbound","id":"5-0","fields":{"text":"' + PASSWORD.encode() + b'"}}\n',
            "unredacted_secret",
        ),
        (
            b'{"stream":"inbound","id":"5-0","fields":{"text":"a"}}\n'
            b'{"stream":"inbound","id":"4-0","fields":{"text":"b"}}\n',
            "bad_order",
        ),
    ],
)
def test_a_signed_file_with_an_entry_the_streams_do_not_have_adds_nothing(
    real_redis: redis_py.Redis, tmp_path: Path, line: bytes, cause: str
) -> None:
    """Signed with this installation's key, but not what save() writes: every entry
    is checked before any is added, and the whole file goes to quarantine."""
    directory = _directory(tmp_path)
    directory.prepare()
    good = b'{"stream":"inbound","id":"1-0","fields":{"text":"fine"}}\n'
    path = directory.directory / backlog.BACKLOG_FILE
    backlog._write(directory, path, [good, line], 1, "a-server")
    restored = _restore(real_redis, directory)
    assert restored.quarantined == cause
    assert real_redis.xlen(SERVICE.inbound) == 0 and real_redis.xlen(SERVICE.outbound) == 0


def test_the_async_door_saves_and_restores_the_backlog_as_the_blocking_one(
    real_servers: dict[str, Any], real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    """Both doors have the same methods; the async one runs the file code in a thread
    and sends its commands on its own loop."""
    inbound, outbound = _fill(real_redis)
    url = real_servers["valkey"].url

    async def save_then_restore() -> tuple[Any, Any]:
        async with AsyncConversationStore(connect_async(url), snapshot_dir=tmp_path) as door:
            saved = await door.save_backlog()
            real_redis.flushall()
            return saved, await door.restore_backlog()

    saved, restored = asyncio.run(save_then_restore())
    assert (saved.inbound, saved.outbound) == (len(inbound), len(outbound))
    assert (restored.inbound, restored.outbound) == (len(inbound), len(outbound))
    assert [e[0].decode() for e in real_redis.xrange(SERVICE.inbound)] == inbound
    assert not (tmp_path / backlog.BACKLOG_FILE).exists()


def test_a_post_during_the_last_save_is_saved_or_refused_never_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper's last save (embedded.final_flush) reads gm:inbound, then the server
    stops. A bridge's XADD that the server acknowledges after that read must be in
    the file; otherwise the bridge believes it posted a message nobody will answer."""
    settings = Settings(storage_path=tmp_path, conversation={"persistence_enabled": True})
    fields = {"avatar_uuid": avatar(1), "channel": "im", "text": "posted during the stop"}
    with EmbeddedValkey(tmp_path / "valkey") as server:
        bridge = redis_py.Redis(unix_socket_path=str(server.socket_path))
        bridge.xadd(SERVICE.inbound, fields)
        connection = bridge.connection_pool.get_connection()
        read_outbound = backlog._outbound

        def a_bridge_posts_meanwhile(executor: Executor, key: str, most: int) -> Any:
            connection.send_command("XADD", SERVICE.inbound, "*", *sum(fields.items(), ()))
            return read_outbound(executor, key, most)

        monkeypatch.setattr(backlog, "_outbound", a_bridge_posts_meanwhile)
        final_flush(settings, server.url)
        monkeypatch.undo()
        server.stop()
        try:
            accepted: str | None = connection.read_response().decode()
        except (redis_py.ConnectionError, OSError):
            accepted = None  # refused: the bridge knows to post it again
        connection.disconnect()
    data = (tmp_path / "conversations" / backlog.BACKLOG_FILE).read_bytes()
    if accepted is not None:
        assert f'"id":"{accepted}"'.encode() in data, "acknowledged, then lost"
    assert data.count(b'"stream":"inbound"') == 1


def test_a_new_server_that_got_posts_first_gets_the_saved_messages_at_new_ids(
    real_redis: redis_py.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bridge may post to a new server before the restore runs: its entry is above
    every saved ID, which the stream then refuses. The saved messages were never
    answered (that server is gone): they come back at new IDs, not lost; the replies
    are not renumbered (a bridge would read them twice)."""
    directory, path = _saved(real_redis, tmp_path)
    saved = [fields for _, fields in real_redis.xrange(SERVICE.inbound)]
    real_redis.flushall()
    early = real_redis.xadd(
        SERVICE.inbound, {"avatar_uuid": avatar(9), "channel": "im", "text": "first!"}
    )
    monkeypatch.setattr(backlog, "_server_id", lambda executor: "a-new-server")
    restored = _restore(real_redis, directory)
    assert (restored.renumbered, restored.inbound, restored.outbound) == (5, 0, 3)
    entries = real_redis.xrange(SERVICE.inbound)
    assert entries[0][0] == early and len(entries) == 6
    texts = [fields[b"text"] for _, fields in entries[1:]]
    assert texts == [DEFAULT_REDACTOR.redact(f[b"text"].decode())[0].encode() for f in saved]
    assert not path.exists()


def test_the_server_that_still_runs_gets_nothing_again(
    real_redis: redis_py.Redis, tmp_path: Path
) -> None:
    """Kept up by another user: every saved entry is there or was answered since."""
    directory, path = _saved(real_redis, tmp_path)
    run_id = real_redis.info("server")["run_id"]
    assert (
        parse_header(
            path.read_bytes(),
            directory.key(),
            magic_expected=backlog.MAGIC,
            versions=frozenset({backlog.FORMAT_VERSION}),
        ).boot_id
        == run_id
    )
    for entry_id, _ in real_redis.xrange(SERVICE.inbound):
        real_redis.xdel(SERVICE.inbound, entry_id)  # answered meanwhile
    real_redis.xadd(SERVICE.inbound, {"avatar_uuid": avatar(9), "channel": "im", "text": "later"})
    restored = _restore(real_redis, directory)
    assert (restored.renumbered, restored.inbound, restored.skipped) == (0, 0, 8)
    assert real_redis.xlen(SERVICE.inbound) == 1


@pytest.mark.parametrize("restored_into", [4, 3])
def test_every_partition_is_saved_and_each_entry_comes_back_in_its_avatars(
    real_redis: redis_py.Redis, tmp_path: Path, restored_into: int
) -> None:
    """With partitions, the backlog holds every partition's streams (the same entry ID in
    two of them included), and each entry comes back in its avatar's partition: the one
    it was saved from, or, when `partitions` changed meanwhile, the new one; an entry
    without a valid UUID stays in its partition."""
    directory, before = _directory(tmp_path), KeySpace("gm", 1, 4).services()
    # Given 4 partitions' streams, each message on its avatar's partition, the first of
    # each at ID 5-1 (IDs are per stream), a reply on each, and a bad entry on partition 3
    sent = {}
    for n in range(12):
        keys = before[partition_of(avatar(n), 4)]
        fields = {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
        if not real_redis.exists(keys.inbound):
            real_redis.xadd(keys.inbound, fields, id="5-1")
            reply = {**fields, "in_reply_to": "5-1", "session_id": "ab" * 16}
            real_redis.xadd(keys.outbound, reply, id=f"6-{n}")
        else:
            real_redis.xadd(keys.inbound, fields)
        sent[avatar(n)] = fields["text"]
    real_redis.xadd(before[3].inbound, {"avatar_uuid": "bad", "channel": "im", "text": "x"})
    saved = backlog.save(Executor(real_redis), directory, before, created_ms=1)
    assert (saved.inbound, saved.outbound) == (13, 4)
    # When a new server restores it, with `restored_into` partitions
    real_redis.flushall()
    after = KeySpace("gm", 1, restored_into).services()
    executor = Executor(real_redis)
    restored = backlog.restore(executor, directory, after, max_value_bytes=MAX, now_ms=7)
    # Then every entry is back, each in its avatar's partition of the new layout (a
    # message whose ID another partition's took comes back at a new ID)
    assert restored.inbound + restored.renumbered == 13 and restored.outbound == 4
    assert (restored.renumbered > 0) == (restored_into != 4)
    found = {}
    for keys in after:
        for _, fields in real_redis.xrange(keys.inbound):
            uuid = fields[b"avatar_uuid"].decode()
            if uuid == "bad":
                assert keys.partition == 3 % restored_into
                continue
            assert partition_of(uuid, restored_into) == keys.partition
            found[uuid] = fields[b"text"].decode()
        for _, fields in real_redis.xrange(keys.outbound):
            assert partition_of(fields[b"avatar_uuid"].decode(), restored_into) == keys.partition
    assert found == sent
