"""The private Valkey's stream backlog across a stop: saved to disk, restored at the next start.

The private Valkey (no `[redis] url`) keeps everything in memory, and snapshots
hold the sessions only. With persistence on, the streams' backlog goes to one
file, `<snapshot directory>/backlog`, when the server stops (the keeper's last
flush, embedded.final_flush) and after each periodic flush of `gridmem serve`
(so a SIGKILL of everything loses at most one flush interval):

- every entry of `gm:inbound` (what residents said that is not answered yet;
  answered entries are deleted from the stream), at most MAX_INBOUND entries;
- the newest MAX_OUTBOUND entries of `gm:outbound` (replies a bridge may not have
  read yet);

and with `partitions` P > 1, the same of every partition's streams (at most
MAX_INBOUND in all, the newest MAX_OUTBOUND // P replies of each);

each with its original stream ID and fields, every field value redacted (the same
rules as a live write: no secret reaches the disk). The payload is bounded by
MAX_PAYLOAD_BYTES: entries past a bound are not saved, and counted in the log.
An entry that is not UTF-8, or has a field the stream contract does not name
(docs/streams.md), is not saved either (counted; the service would have
dead-lettered it) .

The file is framed and signed as a snapshot generation is (snapshots.Header,
with its own magic): header with the payload's length and SHA-256, a checksum
and an HMAC-SHA256 with the installation's snapshot key; then one JSON object per
line, `{"stream": "inbound"|"outbound", "id": "<ms>-<seq>", "fields": {...}}`,
each stream's entries in ascending ID order. With P > 1 each line also names its
`"partition"` (a line without one is partition 0); a restore puts an entry in its
avatar's partition under the partitions then configured (its saved one for an entry
without a valid UUID), so a changed P still loses no message: where partitions merge,
a message whose ID another one took comes back at a new ID (a reply is not added
again, as below). It is written as a generation is
(temp file 0600 in the same directory, fsync, os.replace, fsync of the
directory), under the snapshot directory's lock.

restore() checks the whole file before anything reaches Redis: signature, format
version, length and hash, then every entry (stream, ID shape and order, field
names, sizes, nothing redaction would still change). A file that fails any check
is moved to `quarantine/` and nothing of it is added. A valid file's entries are
added at their original IDs, each only if its ID is above the stream's last
generated ID: restoring into a server that still holds them (another user kept
it up) adds nothing. Then the file is deleted, so it is never replayed twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import redis

from gridmem.errors import InvalidInput
from gridmem.keys import INBOUND_FIELDS
from gridmem.keys import OUTBOUND_FIELDS
from gridmem.keys import ServiceKeys
from gridmem.partitions import MAX_PARTITIONS
from gridmem.partitions import partition_of
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.redaction import Redactor
from gridmem.snapshots import HEADER_SIZE
from gridmem.snapshots import TEMP_PREFIX
from gridmem.snapshots import Header
from gridmem.snapshots import SnapshotDirectory
from gridmem.snapshots import SnapshotError
from gridmem.snapshots import SnapshotInvalid
from gridmem.snapshots import _fsync_directory
from gridmem.snapshots import _open_regular
from gridmem.snapshots import parse_header
from gridmem.snapshots import unredacted

if TYPE_CHECKING:
    from gridmem.executor import Executor

log = logging.getLogger("gridmem.backlog")

BACKLOG_FILE = "backlog"
MAGIC = b"GMBACKLG"
FORMAT_VERSION = 1
MAX_INBOUND = 100_000  # inbound entries saved, oldest first
MAX_OUTBOUND = 10_000  # outbound entries saved, the newest
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024  # inbound first, then outbound, until this is reached
PAGE = 500  # entries read per XRANGE / XREVRANGE call

_STREAM_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_U64 = 2**64


@dataclass
class SaveReport:
    """What save() wrote (counts only, never content)."""

    inbound: int = 0
    outbound: int = 0
    dropped: int = 0  # entries not UTF-8 or with unknown fields
    over_bounds: int = 0  # entries past MAX_INBOUND or MAX_PAYLOAD_BYTES
    bytes: int = 0  # the file's size; 0 when there was nothing to save (no file)


@dataclass
class RestoreReport:
    """What restore() did (counts only)."""

    found: bool = False
    inbound: int = 0  # entries added
    outbound: int = 0
    skipped: int = 0  # valid entries not added: the stream already had their IDs
    renumbered: int = 0  # inbound entries a new server had posts above: added at new IDs
    quarantined: str | None = None  # why the file was refused, if it was


def parse_id(text: str) -> tuple[int, int] | None:
    """A stream ID `<ms>-<seq>` as two integers, or None if it is not one (or is 0-0)."""
    match = _STREAM_ID.fullmatch(text)
    if match is None:
        return None
    ms, seq = int(match.group(1)), int(match.group(2))
    if ms >= _U64 or seq >= _U64 or (ms, seq) == (0, 0):
        return None
    return ms, seq


# -- saving ---------------------------------------------------------------------------


def _decode(
    entry_id: Any, fields: Any, allowed: frozenset[str]
) -> tuple[str, dict[str, str]] | None:
    """Strict UTF-8 decoding of one entry; None if it cannot be saved."""
    try:
        text_id = entry_id.decode("utf-8") if isinstance(entry_id, bytes) else str(entry_id)
        decoded: dict[str, str] = {}
        for name, value in fields.items():
            key = name.decode("utf-8") if isinstance(name, bytes) else str(name)
            decoded[key] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        return None
    if parse_id(text_id) is None or not set(decoded) <= allowed:
        return None
    return text_id, decoded


def _line(
    stream: str, partition: int | None, entry_id: str, fields: dict[str, str], redactor: Redactor
) -> bytes:
    clean = {name: redactor.redact(value)[0] for name, value in fields.items()}
    data: dict[str, Any] = {"stream": stream, "id": entry_id, "fields": clean}
    if partition is not None:
        data["partition"] = partition
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _inbound(executor: Executor, key: str) -> Iterator[tuple[Any, Any]]:
    start = "-"
    while True:
        page = executor.command("XRANGE", key, start, "+", "COUNT", PAGE)
        if not page:
            return
        yield from page
        last = page[-1][0]
        start = "(" + (last.decode("ascii") if isinstance(last, bytes) else str(last))


def _outbound(executor: Executor, key: str, most: int) -> Iterator[tuple[Any, Any]]:
    """The newest `most` entries, oldest first."""
    got: list[tuple[Any, Any]] = []
    end = "+"
    while len(got) < most:
        page = executor.command("XREVRANGE", key, end, "-", "COUNT", min(PAGE, most - len(got)))
        if not page:
            break
        got += page
        last = page[-1][0]
        end = "(" + (last.decode("ascii") if isinstance(last, bytes) else str(last))
    got.reverse()
    return iter(got)


@dataclass
class _Collector:
    """The lines of one save, within MAX_PAYLOAD_BYTES; what is left out is counted."""

    report: SaveReport
    redactor: Redactor
    lines: list[bytes] = field(default_factory=list)
    budget: int = MAX_PAYLOAD_BYTES

    def keep(
        self, stream: str, partition: int | None, entries: Iterable[tuple[Any, Any]], most: int
    ) -> int:
        """Add one stream's entries while `most` and the byte budget allow; how many.
        `partition` is written in each line when the streams are partitioned."""
        allowed = INBOUND_FIELDS if stream == "inbound" else OUTBOUND_FIELDS
        kept = 0
        for entry_id, fields in entries:
            decoded = _decode(entry_id, fields, allowed)
            # a reply always has every field (publish_reply writes them all)
            if decoded is None or (stream == "outbound" and set(decoded[1]) != allowed):
                self.report.dropped += 1
                continue
            line = _line(stream, partition, *decoded, self.redactor)
            if kept >= most or len(line) > self.budget:
                self.report.over_bounds += 1
                continue
            self.budget -= len(line)
            self.lines.append(line)
            kept += 1
        return kept


def save(
    executor: Executor,
    directory: SnapshotDirectory,
    services: Sequence[ServiceKeys],
    *,
    created_ms: int,
    redactor: Redactor = DEFAULT_REDACTOR,
) -> SaveReport:
    """Write the streams' backlog to `<directory>/backlog`, replacing an older file
    (or removing it when both streams are empty). Raises SnapshotError if it cannot
    be written (the older file is then untouched), redis errors if the server
    cannot be read."""
    report = SaveReport()
    collect = _Collector(report, redactor)  # inbound first: what waits matters most
    named = len(services) > 1
    for keys in services:
        partition = keys.partition if named else None
        most = MAX_INBOUND - report.inbound
        report.inbound += collect.keep("inbound", partition, _inbound(executor, keys.inbound), most)
    for keys in services:
        partition = keys.partition if named else None
        most = MAX_OUTBOUND // len(services)
        replies = _outbound(executor, keys.outbound, most)
        report.outbound += collect.keep("outbound", partition, replies, most)
    lines = collect.lines
    with directory.locked():
        final = directory.directory / BACKLOG_FILE
        if not lines:
            with contextlib.suppress(FileNotFoundError):
                final.unlink()
                _fsync_directory(directory.directory, directory.posix)
            return report
        report.bytes = _write(directory, final, lines, created_ms, _server_id(executor))
    return report


def _server_id(executor: Executor) -> str:
    """The server's run_id: a new one each time a server starts (INFO server)."""
    info = executor.command("INFO", "server")
    if isinstance(info, bytes | str):  # no reply callback: the raw text
        text = info.decode("utf-8", "replace") if isinstance(info, bytes) else info
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return _text(info.get("run_id", info.get(b"run_id", ""))).strip()[:64]


def _write(
    directory: SnapshotDirectory, final: Path, lines: list[bytes], created_ms: int, server: str
) -> int:
    key = directory.key()
    payload = b"".join(lines)
    # the header's boot_id field names the server the entries were read from: restore
    # tells a server that still holds them (or answered them) from a new one
    header = Header(
        FORMAT_VERSION, 0, created_ms, server, len(payload), hashlib.sha256(payload).digest(), MAGIC
    )
    temp = directory.directory / f"{TEMP_PREFIX}backlog-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(header.encode(key))
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise SnapshotError(
            f"cannot write the stream backlog {final}: {exc.strerror or exc}"
        ) from None
    _fsync_directory(directory.directory, directory.posix)
    return HEADER_SIZE + len(payload)


# -- restoring ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    stream: str
    id: str
    order: tuple[int, int]
    fields: dict[str, str]
    partition: int = 0


def _check_fields(stream: str, fields: Any, max_value_bytes: int, redactor: Redactor) -> None:
    if not isinstance(fields, dict) or not fields:
        raise SnapshotInvalid("bad_entry", "no fields")
    names = set(fields)
    if stream == "inbound" and not names <= INBOUND_FIELDS:
        raise SnapshotInvalid("bad_field", "a field the inbound stream does not have")
    if stream == "outbound":
        if names != OUTBOUND_FIELDS:
            raise SnapshotInvalid("bad_field", "not the outbound stream's fields")
        if not isinstance(fields["in_reply_to"], str) or parse_id(fields["in_reply_to"]) is None:
            raise SnapshotInvalid("bad_id", "in_reply_to is not a stream ID")
    for value in fields.values():
        if not isinstance(value, str) or len(value.encode("utf-8")) > max_value_bytes:
            raise SnapshotInvalid("bad_field", "a field value that is not a bounded string")
        if unredacted(value, redactor):
            raise SnapshotInvalid("unredacted_secret", "a field holds a secret")


def _check_line(raw: bytes, max_value_bytes: int, redactor: Redactor) -> _Entry:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SnapshotInvalid("bad_line", "not a JSON line") from None
    if not isinstance(data, dict) or set(data) - {"partition"} != {"stream", "id", "fields"}:
        raise SnapshotInvalid("bad_entry", "not a backlog entry")
    stream, entry_id, fields = data["stream"], data["id"], data["fields"]
    partition = data.get("partition", 0)
    if type(partition) is not int or not 0 <= partition < MAX_PARTITIONS:
        raise SnapshotInvalid("bad_entry", "not a partition")
    if stream not in ("inbound", "outbound"):
        raise SnapshotInvalid("bad_entry", "unknown stream")
    order = parse_id(entry_id) if isinstance(entry_id, str) else None
    if order is None:
        raise SnapshotInvalid("bad_id", "not a stream ID")
    _check_fields(stream, fields, max_value_bytes, redactor)
    return _Entry(stream, entry_id, order, fields, partition)


def _read(
    directory: SnapshotDirectory, path: Path, max_value_bytes: int, redactor: Redactor
) -> tuple[str, list[_Entry]]:
    """The saving server's run_id and every entry of a file that passes every check;
    SnapshotInvalid otherwise."""
    key = directory.key(create=False)
    try:
        with _open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > HEADER_SIZE + MAX_PAYLOAD_BYTES:
                raise SnapshotInvalid("oversized", "larger than a backlog can be")
            data = fh.read()
    except OSError as exc:
        raise SnapshotInvalid("unreadable", str(exc.strerror or exc)) from None
    header = parse_header(data, key, magic_expected=MAGIC, versions=frozenset({FORMAT_VERSION}))
    payload = data[HEADER_SIZE:]
    if len(payload) != header.payload_len:
        raise SnapshotInvalid("truncated", "payload length differs from the header's")
    if not hmac.compare_digest(hashlib.sha256(payload).digest(), header.payload_sha):
        raise SnapshotInvalid("checksum_mismatch", "payload damaged")
    entries: list[_Entry] = []
    last: dict[tuple[str, int], tuple[int, int]] = {}
    counts = {"inbound": 0, "outbound": 0}
    for raw in payload.splitlines():
        entry = _check_line(raw, max_value_bytes, redactor)
        stream = (entry.stream, entry.partition)
        if stream in last and entry.order <= last[stream]:
            raise SnapshotInvalid("bad_order", "stream IDs not ascending")
        last[stream] = entry.order
        counts[entry.stream] += 1
        entries.append(entry)
    if counts["inbound"] > MAX_INBOUND or counts["outbound"] > MAX_OUTBOUND:
        raise SnapshotInvalid("oversized", "more entries than a backlog holds")
    if payload and not payload.endswith(b"\n"):
        raise SnapshotInvalid("truncated", "the last line is cut")
    return header.boot_id, entries


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _last_id(executor: Executor, key: str) -> tuple[int, int]:
    """The stream's last generated ID ((0, 0) when it does not exist)."""
    try:
        info = executor.command("XINFO", "STREAM", key)
    except redis.ResponseError:  # no such key
        return (0, 0)
    if isinstance(info, list):  # RESP2 without a callback: field, value, field, value...
        info = dict(zip(info[::2], info[1::2], strict=True))
    info = {_text(k): v for k, v in info.items()}  # field names may come as bytes
    raw = info["last-generated-id"]
    parsed = parse_id(raw.decode("ascii") if isinstance(raw, bytes) else str(raw))
    return parsed or (0, 0)


def restore(
    executor: Executor,
    directory: SnapshotDirectory,
    services: Sequence[ServiceKeys],
    *,
    max_value_bytes: int,
    now_ms: int,
    redactor: Redactor = DEFAULT_REDACTOR,
) -> RestoreReport:
    """Add a saved backlog's entries to the streams, then delete the file.

    Call before the consumer group is created (it starts at ID 0: the restored
    inbound entries are delivered). A file that fails a check goes to quarantine/
    as `backlog.<now_ms>` and adds nothing. Raises SnapshotError when the file
    cannot be verified (no key) and redis errors when the server fails: the file
    then stays for the next start."""
    report = RestoreReport()
    with directory.locked():
        path = directory.directory / BACKLOG_FILE
        if not os.path.lexists(path):
            return report
        report.found = True
        try:
            saved_by, entries = _read(directory, path, max_value_bytes, redactor)
        except SnapshotInvalid as exc:
            report.quarantined = exc.cause
            if not directory.quarantine(path, f"{BACKLOG_FILE}.{now_ms}"):
                # never input: it stays where it is and is refused again next time
                log.error("the stream backlog could not be moved to quarantine")
            return report
        # The server the entries were read from still runs (another user kept it up):
        # each is there, or was answered and deleted. A new server holds none of them;
        # a bridge may have posted to it already, above their IDs.
        new_server = saved_by != _server_id(executor)
        streams: dict[tuple[str, int], list[_Entry]] = {}
        for entry in entries:
            streams.setdefault((entry.stream, _partition(entry, len(services))), []).append(entry)
        for (stream, partition), mine in sorted(streams.items()):
            mine.sort(key=lambda e: e.order)  # saved partitions may have merged into one
            _add(executor, getattr(services[partition], stream), mine, new_server, report)
        path.unlink()
        _fsync_directory(directory.directory, directory.posix)
    return report


def _add(
    executor: Executor, key: str, mine: list[_Entry], new_server: bool, report: RestoreReport
) -> None:
    """Add one stream's saved entries (ascending IDs) to it, counted in `report`: at
    their own IDs first (those above the stream's last), then the renumbered ones, since
    a new ID is above every saved one."""
    last = top = _last_id(executor, key)
    later: list[_Entry] = []
    for entry in mine:
        # the stream had this ID (or a later one) before; or, `partitions` having
        # changed, an entry of another saved partition took it here
        taken, clash = entry.order <= last, last < entry.order <= top
        # an unanswered message comes back at a new ID rather than not at all;
        # a reply does not (at a new ID, a bridge would read it twice)
        if entry.stream == "inbound" and ((new_server and taken) or clash):
            later.append(entry)
        elif taken or clash:
            report.skipped += 1
        elif _xadd(executor, key, entry.id, entry, report):
            top = entry.order
            report.inbound += entry.stream == "inbound"
            report.outbound += entry.stream == "outbound"
    for entry in later:
        if _xadd(executor, key, "*", entry, report):
            report.renumbered += 1


def _xadd(executor: Executor, key: str, at: str, entry: _Entry, report: RestoreReport) -> bool:
    fields = [part for pair in entry.fields.items() for part in pair]
    try:
        executor.command("XADD", key, at, *fields)
    except redis.ResponseError:
        report.skipped += 1  # someone added a newer entry meanwhile
        return False
    return True


def _partition(entry: _Entry, partitions: int) -> int:
    """Where an entry goes back: its avatar's partition (the one it was saved from,
    unless `partitions` changed since), or its saved one when it has no valid UUID."""
    try:
        return partition_of(entry.fields.get("avatar_uuid", ""), partitions)
    except InvalidInput:
        return entry.partition if entry.partition < partitions else 0
