"""Opt-in persistence: crash-safe snapshot generations, validated restore, quarantine.

A generation is one immutable file `<generation, 20 digits>.snap` in the
snapshot directory:

    header   magic, format version, flags, generation, created-at wall ms, boot id,
             payload length, SHA-256 of the payload, SHA-256 of the header so far
             (the checksum), HMAC-SHA256 of the header so far (the signature)
    payload  one session per line (format 2: a JSON head, then its stored entries
             verbatim; see FORMAT_VERSION and snapshot_line)

The checksum catches damage (a cut or flipped byte anywhere: the payload's hash
is in the header). The signature uses a per-installation key (`snapshot.key`,
0600) and catches files edited or swapped in by anything that does not hold it:
a record relabelled from avatar to agent with a recomputed checksum is refused
by the signature, not by luck. After both, every session goes through the same
models, bounds and redaction rules as a live write; the first failure moves the
whole generation to `quarantine/` and the next older one is tried. Nothing
reaches Redis before a generation has passed every check.

Writing: a temp file (name starting with `.tmp-`) in the same directory,
fsynced, renamed over the final name with `os.replace`, then the directory is
fsynced; a crash at any point leaves the old generations intact and at most a
temp file, which the next start removes. One file lock serialises flushers and
restorers across processes.

The directory is ours alone, and nothing in it is trusted to be what its name
says: no chmod, open or move follows a symbolic link (O_NOFOLLOW, lstat), a
snapshot directory that is itself a link is refused (SnapshotError), and an
entry named like a generation that is not a regular file, or whose number the
header cannot hold, is skipped and reported, never read (a fifo would block). A
regular file with other hard links is never chmod-ed (reported `hard_linked`), and
a new generation is numbered after the newest one this installation signed, so
no stray name (however large its number) can stop a flush.
Whatever the write path stored, restore accepts: its secret check asks what
redaction would still change, not whether a rule matches (the write path's own
markers do), and a summary is checked line by line, the unit Lua folds.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import itertools
import json
import os
import re
import secrets
import stat
import struct
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import IO
from typing import Annotated
from typing import Any
from typing import Literal

from filelock import FileLock
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from gridmem.codec import CODE_KIND
from gridmem.codec import FIELD_NAMES
from gridmem.codec import read_entries
from gridmem.config import SUMMARY_LINE_BYTES
from gridmem.config import Limits
from gridmem.errors import CorruptRecord
from gridmem.errors import GridmemError
from gridmem.ids import SESSION_ID
from gridmem.ids import UUID_CANONICAL
from gridmem.prepare import AGENT_HEAD
from gridmem.prepare import AVATAR_HEAD
from gridmem.prepare import UNREADABLE_LINE
from gridmem.prepare import action_head
from gridmem.prepare import tool_head
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import ActionResult
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import Channel
from gridmem.records import ToolSummary
from gridmem.redaction import Redactor
from gridmem.scripts import ExportedSession

MAGIC = b"GRIDMEM\x1a"
# Version 2 (what flush writes) carries each record as the transcript entry Redis
# stores, verbatim (`<seq>|<at ms>|<session id>|<payload JSON>`, see snapshot_line),
# so a flush neither decodes nor re-encodes payloads (docs/benchmarks.md, Snapshots).
# Version 1 spelled each record out as {seq, at_ms, record: {kind, fields}}:
# SnapshotSession, the shape every version is read into and validated as.
# Restore reads both.
FORMAT_VERSION = 2
RECORDS_VERSION = 1
ENTRY_SEPARATOR = SEP = b"\x1f"  # between a format-2 line's parts (ASCII unit separator)
# Versions older than RECORDS_VERSION this code can read, each with the function
# that lifts a session line one version up. None yet: version 1 is the first.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
# magic, version, flags, generation, created_ms, boot id (padded), payload length, payload sha256
_FIELDS = struct.Struct(">8sHHQQ64sQ32s")
HEADER_SIZE = _FIELDS.size + 32 + 32  # + checksum + signature
SUFFIX = ".snap"
TEMP_PREFIX = ".tmp-"
WRITE_CHUNK_BYTES = 256 << 10  # flush writes and hashes its lines this many bytes at a time
KEY_FILE = "snapshot.key"
LOCK_FILE = ".lock"
QUARANTINE = "quarantine"
QUARANTINE_KEEP = 10  # files kept in quarantine/, oldest dropped first
_GENERATION_NAME = re.compile(r"(\d{20})\.snap")
# The header holds a generation in 64 bits; a larger name is no generation of ours.
MAX_GENERATION = 2**64 - 1
_NAME = r"[A-Za-z0-9_.:\-]{1,64}"
# A folded summary line: one of the heads lua/lib.lua summary_line() writes
# (gridmem/prepare.py holds the same heads), then any text; or the unreadable line.
_SUMMARY_LINE = re.compile(
    "(?:"
    + "|".join(
        [
            re.escape(AVATAR_HEAD),
            re.escape(AGENT_HEAD),
            re.escape(tool_head("NAME")).replace("NAME", _NAME),
            re.escape(action_head("NAME", "STATUS"))
            .replace("NAME", _NAME)
            .replace("STATUS", "(?:ok|failed|denied)"),
        ]
    )
    + ").*|"
    + re.escape(UNREADABLE_LINE)
)
SUMMARY_LINE_MAX = SUMMARY_LINE_BYTES
# Opening flags that refuse a link as the last component and never wait on a fifo.
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)

# Steps of flush() a crash test can stop at (the hook is called with the step's name).
STEPS = ("written", "synced", "replaced", "pruning")


class SnapshotError(GridmemError):
    """A snapshot could not be written; the previous generations are untouched."""


class SnapshotInvalid(Exception):
    """A generation failed validation. `cause` is a stable code for the event."""

    def __init__(self, cause: str, detail: str = "") -> None:
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause


# -- the session format -------------------------------------------------------------

_UUID = rf"^{UUID_CANONICAL}$"
_SID = rf"^{SESSION_ID}$"
_MS = Annotated[int, Field(ge=0, lt=2**53)]
_KIND_RECORDS = Annotated[
    AvatarMessage | AgentReply | ToolSummary | ActionResult, Field(discriminator="kind")
]


class SnapshotRecord(BaseModel):
    """One transcript record: the same four kinds as a live write, nothing else."""

    model_config = ConfigDict(extra="forbid", strict=True)

    seq: Annotated[int, Field(ge=1, lt=2**53)]
    at_ms: _MS
    record: _KIND_RECORDS


class SnapshotSession(BaseModel):
    """One session as a snapshot line."""

    model_config = ConfigDict(extra="forbid", strict=True)

    avatar_uuid: Annotated[str, Field(pattern=_UUID)]
    channel: Literal["public", "im"]
    session_id: Annotated[str, Field(pattern=_SID)]
    created_at_ms: _MS
    last_active_at_ms: _MS
    summary: str = ""
    records: Annotated[list[SnapshotRecord], Field(min_length=1)]
    receipts: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")],
        Annotated[str, Field(pattern=r"^\d+:[01]:\d+:[01]$")],
    ] = Field(default_factory=dict)
    # Archive segments (opt-in): records folded out of the live context, oldest first.
    archive: list[Annotated[list[SnapshotRecord], Field(min_length=1)]] = Field(
        default_factory=list
    )

    @property
    def member(self) -> str:
        return f"{self.avatar_uuid}:{self.channel}"


def unredacted(value: str, redactor: Redactor) -> bool:
    """Would redaction still change this text? Its own markers match some rules
    (`?token=[REDACTED:...]`), so a match alone proves nothing; a change does."""
    return redactor.redact(value)[0] != value


def check_session(session: SnapshotSession, limits: Limits, redactor: Redactor) -> None:
    """Everything the models cannot say: order, time, bounds, format, secrets."""
    archived = [r for segment in session.archive for r in segment]
    seqs = [r.seq for r in archived + session.records]
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        raise SnapshotInvalid("sequence_order", "sequence numbers must strictly increase")
    if session.created_at_ms > session.last_active_at_ms:
        raise SnapshotInvalid("timestamps", "created after last active")
    for item in archived + session.records:
        _check_record(item.record, limits, redactor)
    summary = session.summary
    if len(summary.encode("utf-8")) > limits.max_summary_bytes:
        raise SnapshotInvalid("over_bounds", "summary over max_summary_bytes")
    lines = summary.split("\n") if summary else []
    for line in lines:
        if len(line.encode("utf-8")) > SUMMARY_LINE_MAX or not _SUMMARY_LINE.fullmatch(line):
            raise SnapshotInvalid("bad_summary", "a summary line is not in the folded format")
    # Line by line: each is one folded record, checked as such when it was written
    # (gridmem/prepare.py); two lines side by side are no text anyone wrote.
    if any(unredacted(line, redactor) for line in lines):
        raise SnapshotInvalid("unredacted_secret", "the summary holds a secret")


def _check_record(record: Any, limits: Limits, redactor: Redactor) -> None:
    texts: list[tuple[str, int]] = []
    names: list[str] = []
    match record:
        case AvatarMessage(text=t) | AgentReply(text=t):
            texts.append((t, limits.max_text_bytes))
        case ToolSummary(tool=tool, summary=summary):
            texts.append((summary, limits.max_tool_result_bytes))
            names.append(tool)
        case ActionResult(action=action, detail=detail):
            texts.append((detail, limits.max_text_bytes))
            names.append(action)
    for text, bound in texts:
        if len(text.encode("utf-8")) > bound:
            raise SnapshotInvalid("over_bounds", "a record's text is over its limit")
    for value in [t for t, _ in texts] + names:
        if unredacted(value, redactor):
            raise SnapshotInvalid("unredacted_secret", "a record holds a secret")


# -- framing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    generation: int
    created_ms: int
    boot_id: str
    payload_len: int
    payload_sha: bytes
    magic: bytes = MAGIC  # 8 bytes: what kind of file (the stream backlog has its own)

    def fields(self) -> bytes:
        boot = self.boot_id.encode("utf-8")[:64].ljust(64, b"\0")
        return _FIELDS.pack(
            self.magic, self.version, 0, self.generation, self.created_ms, boot,
            self.payload_len, self.payload_sha,
        )  # fmt: skip

    def encode(self, key: bytes) -> bytes:
        fields = self.fields()
        checksum = hashlib.sha256(fields).digest()
        signature = hmac.new(key, fields + checksum, hashlib.sha256).digest()
        return fields + checksum + signature


def parse_header(
    data: bytes,
    key: bytes,
    *,
    magic_expected: bytes = MAGIC,
    versions: frozenset[int] | None = None,
) -> Header:
    """Check magic, version, checksum and signature of a header (HEADER_SIZE bytes).

    A snapshot's by default; gridmem/backlog.py frames its file the same way with
    its own magic and format versions."""
    if len(data) < HEADER_SIZE:
        raise SnapshotInvalid("truncated", "shorter than a header")
    fields = data[: _FIELDS.size]
    checksum = data[_FIELDS.size : _FIELDS.size + 32]
    signature = data[_FIELDS.size + 32 : HEADER_SIZE]
    magic, version, _flags, generation, created, boot, length, payload_sha = _FIELDS.unpack(fields)
    if magic != magic_expected:
        raise SnapshotInvalid("bad_magic", "not a gridmem snapshot")
    if not hmac.compare_digest(hashlib.sha256(fields).digest(), checksum):
        raise SnapshotInvalid("checksum_mismatch", "header damaged")
    if not hmac.compare_digest(
        hmac.new(key, fields + checksum, hashlib.sha256).digest(), signature
    ):
        raise SnapshotInvalid("signature_mismatch", "not signed with this installation's key")
    known = versions if versions is not None else {FORMAT_VERSION, RECORDS_VERSION, *MIGRATIONS}
    if version not in known:
        raise SnapshotInvalid("unsupported_version", f"format version {version}")
    boot_id = boot.rstrip(b"\0").decode("utf-8", "replace")
    return Header(version, generation, created, boot_id, length, payload_sha, magic)


# -- results ----------------------------------------------------------------------------


class SkippedEntry(BaseModel):
    """A directory entry restore did not use, and why (never read, never moved).

    reason: `not_a_regular_file` (a link, directory, fifo... named like a
    generation), `generation_out_of_range` (a number the header cannot hold),
    `quarantine_unusable` (a failed generation left in place: `quarantine` is not
    a real directory, or the move failed), or `hard_linked` (a regular file with
    other hard links, of any name: its mode is left as it is, since a chmod would
    change the file every other name points at, outside the directory too; a
    hard-linked generation is still read, as any other, and must pass every check),
    or `chmod_failed` (a regular file whose mode could not be set to 0600: another
    user's file, a read-only mount; left as it is).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    reason: str


class SnapshotInfo(BaseModel):
    """What flush() wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int
    path: Path
    bytes: int
    sessions: int
    created_at_ms: int
    skipped: list[SkippedEntry] = Field(default_factory=list)  # entries left as they were


class QuarantinedGeneration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int
    cause: str


class RestoreReport(BaseModel):
    """What restore() did. Restore never raises: problems are reported here."""

    model_config = ConfigDict(extra="forbid")

    ran: bool = False  # False: persistence off, or this store was already restored
    generation: int | None = None
    sessions_restored: int = 0
    sessions_live: int = 0  # already present in the store: never overwritten
    sessions_expired: int = 0  # past their TTL by wall-clock age: not restored
    quarantined: list[QuarantinedGeneration] = Field(default_factory=list)
    unreadable: list[int] = Field(default_factory=list)  # generations that could not be opened
    skipped: list[SkippedEntry] = Field(default_factory=list)  # stray entries, never read
    error: str | None = None


# -- the directory ---------------------------------------------------------------------------


@dataclass
class ValidatedGeneration:
    """A generation that passed every check: where each session's line is, oldest first."""

    generation: int
    path: Path
    version: int  # the format version its lines are in
    identity: tuple[int, int] = (0, 0)  # (device, inode) of the file that was checked
    # (last active, offset, length, digest of the line's bytes as checked)
    lines: list[tuple[int, int, int, bytes]] = field(default_factory=list)


class SnapshotDirectory:
    """Generations, temp files, the key, the lock and quarantine in one directory."""

    def __init__(
        self,
        directory: Path,
        limits: Limits,
        redactor: Redactor,
        *,
        hook: Callable[[str], None] | None = None,
        posix: bool | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.limits = limits
        self.redactor = redactor
        self.hook = hook or (lambda step: None)
        self.posix = os.name == "posix" if posix is None else posix
        self._lock = FileLock(str(self.directory / LOCK_FILE), mode=0o600)
        self._left_alone: list[SkippedEntry] = []  # what the last prepare() did not chmod

    # housekeeping

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes: one flusher or restorer at a time.

        Housekeeping runs inside the lock: a temp file is stale only when no
        other process holds the lock (it may be writing that very file).
        """
        self._check_directory()
        lock = self.directory / LOCK_FILE
        if os.path.islink(lock):
            lock.unlink()  # removes the link itself; the lock must be a plain file of ours
        try:
            self._lock.acquire()
        except OSError as exc:
            raise SnapshotError(f"cannot lock {lock}: {exc.strerror or exc}") from None
        try:
            self.prepare()
            yield
        finally:
            self._lock.release()

    def _check_directory(self) -> None:
        """Create the directory if missing; refuse one that is a link or not a directory.

        A linked snapshot directory is refused rather than followed: its target's
        mode would be forced to 0700, and generations would live somewhere no
        setting names. Links among its parents are the operator's layout, allowed.
        """
        try:
            mode = os.lstat(self.directory).st_mode
        except FileNotFoundError:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = os.lstat(self.directory).st_mode
        if stat.S_ISLNK(mode):
            raise SnapshotError(
                f"snapshot directory {self.directory} is a symbolic link; refusing to follow "
                f"it (point the setting at the real directory)"
            )
        if not stat.S_ISDIR(mode):
            raise SnapshotError(f"snapshot directory {self.directory} is not a directory")

    def prepare(self) -> None:
        """Create the directory, force private modes on Unix, drop stale temp files.

        Only regular files get 0600, each through a descriptor opened without
        following links; stray directories, links, fifos are left as they are, and
        so is a file with other hard links (reported `hard_linked` by scan()).
        """
        self._check_directory()
        self._left_alone = []
        if self.posix:
            try:
                _force_mode(self.directory, 0o700, directory=True)
            except OSError as exc:
                raise SnapshotError(
                    f"cannot make snapshot directory {self.directory} private (0700): {_why(exc)}"
                ) from None
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    continue
                if entry.name.startswith(TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)  # a link goes, never its target
                elif self.posix and entry.is_file(follow_symlinks=False):
                    self._force_file_mode(entry.name)

    def _force_file_mode(self, name: str) -> None:
        """0600 on one regular file of the directory, unless it has other hard links or
        its mode cannot be changed (reported, never an error: a stray file never stops
        flush or restore)."""
        reason = _force_mode(self.directory / name, 0o600)
        if reason is not None:
            self._left_alone.append(SkippedEntry(name=name, reason=reason))

    def key(self, *, create: bool = True) -> bytes:
        """The installation's signing key, created by the first flush.

        Reading generations never creates one: without the key that signed them
        they cannot be verified, and quarantining them all would lose them.
        """
        path = self.directory / KEY_FILE
        try:
            with _open_regular(path) as fh:
                text = fh.read(256).decode("ascii")
            return bytes.fromhex(text.strip())
        except FileNotFoundError:
            if not create:
                raise SnapshotError(
                    f"{path} is missing: snapshots in {self.directory} cannot be verified"
                ) from None
        except OSError as exc:
            raise SnapshotError(
                f"{path} cannot be read ({_why(exc)}): snapshots in {self.directory} "
                f"cannot be verified"
            ) from None
        except ValueError:  # UnicodeDecodeError too
            raise SnapshotError(f"{path} is not a snapshot key (expected 64 hex digits)") from None
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key.hex())
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_directory(self.directory, self.posix)
        return key

    def scan(self) -> tuple[list[tuple[int, Path]], list[SkippedEntry]]:
        """(every generation file, oldest first; entries named like one that are not,
        and those the last prepare() left alone)."""
        found: list[tuple[int, Path]] = []
        skipped: list[SkippedEntry] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                match = _GENERATION_NAME.fullmatch(entry.name)
                if not match:
                    continue
                number = int(match.group(1))
                if number > MAX_GENERATION:
                    skipped.append(SkippedEntry(name=entry.name, reason="generation_out_of_range"))
                elif not entry.is_file(follow_symlinks=False):
                    skipped.append(SkippedEntry(name=entry.name, reason="not_a_regular_file"))
                else:
                    found.append((number, Path(entry.path)))
        skipped += self._left_alone
        return sorted(found), sorted(skipped, key=lambda s: (s.name, s.reason))

    def generations(self) -> list[tuple[int, Path]]:
        """Every generation file, oldest first."""
        return self.scan()[0]

    # writing

    def write(self, lines: Iterator[bytes], created_ms: int, boot_id: str) -> SnapshotInfo:
        """Write a new generation from session lines. Call under locked()."""
        key = self.key()
        existing = self.generations()
        generation = self._newest_signed(existing, key) + 1
        # a stray entry (a directory, a link, a file not ours) may hold the next name:
        # never replace it
        while os.path.lexists(self.directory / f"{generation:020d}{SUFFIX}"):
            generation += 1
        if generation > MAX_GENERATION:
            raise SnapshotError(f"no generation number is left in {self.directory}")
        final = self.directory / f"{generation:020d}{SUFFIX}"
        temp = (
            self.directory / f"{TEMP_PREFIX}{generation:020d}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise _write_error(exc, "create", temp, existing) from None
        sessions = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                # a placeholder: the payload's length and hash are known only at the end
                _write_all(fh, b"\0" * HEADER_SIZE)
                digest, length = hashlib.sha256(), 0
                chunk: list[bytes] = []
                size = 0
                for line in lines:
                    chunk.append(line)
                    size += len(line)
                    sessions += 1
                    if size >= WRITE_CHUNK_BYTES:
                        length += _write_chunk(fh, digest, chunk)
                        chunk, size = [], 0
                length += _write_chunk(fh, digest, chunk)
                header = Header(
                    FORMAT_VERSION, generation, created_ms, boot_id, length, digest.digest()
                )
                fh.seek(0)
                _write_all(fh, header.encode(key))
                fh.flush()
                self.hook("written")
                os.fsync(fh.fileno())
            self.hook("synced")
            os.replace(temp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise _write_error(exc, "write", final, existing) from None
        except BaseException:  # the lines failed (a lost connection): no temp file left
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        self.hook("replaced")
        _fsync_directory(self.directory, self.posix)
        self.prune(keep=generation)
        return SnapshotInfo(
            generation=generation,
            path=final,
            bytes=HEADER_SIZE + length,
            sessions=sessions,
            created_at_ms=created_ms,
            skipped=sorted(self._left_alone, key=lambda s: s.name),
        )

    def _newest_signed(self, existing: list[tuple[int, Path]], key: bytes) -> int:
        """The newest generation whose header this installation signed, under its own
        name; 0 if none. A new generation is numbered after it, not after whatever
        the largest name is: a stray `18446744073709551615.snap` (or any file not
        ours with a big number) made every flush fail with no number left. Reads
        one header per file newer than that generation, newest first."""
        for number, path in reversed(existing):
            try:
                with _open_regular(path) as fh:
                    header = parse_header(fh.read(HEADER_SIZE), key)
            except (OSError, SnapshotInvalid):
                continue  # not ours, damaged or unreadable: it numbers nothing
            if header.generation == number:
                return number
        return 0

    def prune(self, keep: int) -> None:
        """Drop the oldest generations until the total fits max_snapshot_bytes; never `keep`."""
        gens = self.generations()
        total = sum(path.lstat().st_size for _, path in gens)
        for generation, path in gens:
            if total <= self.limits.max_snapshot_bytes or generation == keep:
                break
            self.hook("pruning")
            size = path.lstat().st_size
            path.unlink()
            total -= size
        _fsync_directory(self.directory, self.posix)

    # reading

    def validate(self, generation: int, path: Path) -> ValidatedGeneration:
        """Check a generation end to end; raise SnapshotInvalid at the first fault.

        OSError (unreadable) propagates: that is not the file's fault.
        """
        key = self.key(create=False)
        with _open_regular(path) as fh:
            info = os.fstat(fh.fileno())
            header = parse_header(fh.read(HEADER_SIZE), key)
            size = info.st_size
            if header.generation != generation:
                raise SnapshotInvalid("wrong_generation", "file name and header disagree")
            if size != HEADER_SIZE + header.payload_len:
                raise SnapshotInvalid("truncated", "payload length does not match the file")
            digest = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
            if not hmac.compare_digest(digest.digest(), header.payload_sha):
                raise SnapshotInvalid("checksum_mismatch", "payload damaged")
            fh.seek(HEADER_SIZE)
            return self._validate_sessions(header, fh, path, (info.st_dev, info.st_ino))

    def _validate_sessions(
        self, header: Header, fh: IO[bytes], path: Path, identity: tuple[int, int]
    ) -> ValidatedGeneration:
        result = ValidatedGeneration(header.generation, path, header.version, identity)
        seen: set[str] = set()
        offset = HEADER_SIZE
        for line in fh:
            session = self.parse_line(line, header.version)
            if session.member in seen:
                raise SnapshotInvalid("duplicate_session", "a session appears twice")
            seen.add(session.member)
            result.lines.append((session.last_active_at_ms, offset, len(line), _digest(line)))
            offset += len(line)
        result.lines.sort()
        return result

    def parse_line(
        self, line: bytes, version: int = FORMAT_VERSION, *, checked: bool = False
    ) -> SnapshotSession:
        """One session line through the models and check_session() (not `checked`:
        these very bytes passed it already)."""
        try:
            if version == FORMAT_VERSION:
                session = SnapshotSession.model_validate(entries_to_records(line))
            elif version == RECORDS_VERSION:
                session = SnapshotSession.model_validate_json(line)
            else:
                data = json.loads(line)
                for old in range(version, RECORDS_VERSION):
                    data = MIGRATIONS[old](data)
                session = SnapshotSession.model_validate(data)
        except (ValueError, KeyError, TypeError) as exc:  # ValidationError is a ValueError
            raise SnapshotInvalid("invalid_session", type(exc).__name__) from None
        if not checked:
            check_session(session, self.limits, self.redactor)
        return session

    def read_session(
        self, valid: ValidatedGeneration, offset: int, length: int, digest: bytes
    ) -> SnapshotSession:
        """One session of a validated generation, about to be written: the very bytes
        validate() checked (same file, same digest), else OSError ESTALE. Those bytes
        passed check_session() (redaction included), so it is not run again: that
        halved restore's Python time (docs/benchmarks.md, Snapshots)."""
        with _open_regular(valid.path) as fh:
            info = os.fstat(fh.fileno())
            if (info.st_dev, info.st_ino) != valid.identity:
                raise OSError(errno.ESTALE, "replaced since it was checked", str(valid.path))
            fh.seek(offset)
            line = fh.read(length)
        if not hmac.compare_digest(_digest(line), digest):
            raise OSError(errno.ESTALE, "changed since it was checked", str(valid.path))
        return self.parse_line(line, valid.version, checked=True)

    def quarantine(self, path: Path, name: str | None = None) -> bool:
        """Move a failed generation aside (bounded: oldest quarantined files go first),
        as `name` (its own name by default).

        False if it could not be moved: `quarantine` is not a real directory of
        ours (a file, a link: never followed) or the move failed. The generation
        then stays where it is, and restore goes on with the older ones.
        """
        folder = self.directory / QUARANTINE
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):  # lstat: a link is no directory
            return False
        try:
            if self.posix:
                _force_mode(folder, 0o700, directory=True)
            os.replace(path, folder / (name or path.name))
        except FileNotFoundError:
            pass  # gone already (another restorer)
        except OSError:
            return False
        with os.scandir(folder) as entries:
            kept = sorted(e.name for e in entries if e.is_file(follow_symlinks=False))
        for old in kept[: max(0, len(kept) - QUARANTINE_KEEP)]:
            with contextlib.suppress(OSError):
                (folder / old).unlink()
        _fsync_directory(self.directory, self.posix)
        return True


def snapshot_line(session: ExportedSession) -> bytes:
    """One exported session as a snapshot line, format 2 (see FORMAT_VERSION):
    a JSON object (the session, and how many entries follow: live, then each
    archive segment's), then each stored entry verbatim, every part after a unit
    separator (0x1F), then a newline. Neither can occur in a stored entry (JSON
    escapes control characters; the head is digits and hex) and flush checks it,
    so no entry can add to the line's structure. Restore decodes and checks every
    entry (entries_to_records)."""
    entries = session.entries
    if session.archive:
        entries = [*entries, *itertools.chain.from_iterable(session.archive)]
    text = _head_json(session).encode("utf-8")
    line = ENTRY_SEPARATOR.join([text, *entries]) + b"\n"
    _own_entries(line, len(text), len(entries), session.session_id)
    return line


def _head_json(session: ExportedSession) -> str:
    """A format-2 line's head: what json.dumps(head, ensure_ascii=False,
    separators=(",", ":")) writes for the session's head, a dict with these keys
    in this order, each string through json's own string encoder
    (tests/test_snapshots.py compares the two), in half the time
    (docs/benchmarks.md, Snapshots):

        {"avatar_uuid", "channel", "session_id", "created_at_ms",
         "last_active_at_ms", "summary", "receipts", "entries", "archive"}
    """
    uuid, channel = session.member.split(":")
    # Wall clocks step back and hosts disagree: a turn written by a host behind
    # the one that opened the session is stamped before the session's creation.
    # Its activity is at least its creation (restore refuses the reverse).
    last_active = max(session.active_ms, session.created_ms)
    receipts = _HEAD_JSON.encode(session.receipts) if session.receipts else "{}"
    archive = ",".join([str(len(segment)) for segment in session.archive])
    return (
        f'{{"avatar_uuid":{_json_str(uuid)},"channel":{_json_str(channel)},'
        f'"session_id":{_json_str(session.session_id)},'
        f'"created_at_ms":{int(session.created_ms)},"last_active_at_ms":{int(last_active)},'
        f'"summary":{_json_str(session.summary)},"receipts":{receipts},'
        f'"entries":{len(session.entries)},"archive":[{archive}]}}'
    )


# json.dumps(..., ensure_ascii=False, separators=(",", ":")): the encoder built once,
# and the function it writes a string with
_HEAD_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_json_str: Callable[[str], str] = json.encoder.encode_basestring
# A line's entry, from the separator before it: two fields, then the session ID it is
# stamped with (`<seq>|<at ms>|<session id>|...`), each without a bar or separator.
_ENTRY_STAMP = re.compile(rb"\x1f[^|\x1f\n]*\|[^|\x1f\n]*\|([^|\x1f\n]*)\|")


def _own_entries(line: bytes, head: int, count: int, session_id: str) -> None:
    """Every entry of a built line (after its `head` bytes of JSON, which holds neither
    separator) is framed as one of this session's (`<seq>|<ms>|<session id>|...`:
    a store damaged from outside must not put another session's words in this
    line) and holds neither separator of the line. Checked on the whole line, in C
    (count, find, one regex scan), not entry by entry: a third of flush's Python
    time was this check (docs/benchmarks.md, Snapshots). Payloads are decoded at
    restore, whole, before anything reaches Redis."""
    # one 0x1F per entry and one newline, at the end: no entry holds either
    framed = line.count(SEP) == count and line.find(b"\n") == len(line) - 1
    # then each entry begins right after its own 0x1F, so each stamp found is one
    # entry's, and an entry not framed so yields none
    stamps = _ENTRY_STAMP.findall(line, head) if framed else []
    if not framed or stamps.count(session_id.encode()) != count:
        raise CorruptRecord("a stored transcript entry cannot be decoded")


def entries_to_records(line: bytes) -> dict[str, Any]:
    """A format-2 line in the records shape (format 1) that SnapshotSession
    validates: each entry decoded and checked as codec.read_entries checks a stored
    one (its session ID must be the line's). Raises ValueError, KeyError or TypeError
    on anything else: counts that do not add up, an entry that is not UTF-8, a
    non-canonical number, an unknown kind."""
    head, *entries = line.removesuffix(b"\n").split(ENTRY_SEPARATOR)
    data = json.loads(head)
    if type(data) is not dict or "records" in data:
        raise TypeError("not a format 2 session")
    live, sizes = data.pop("entries"), data.pop("archive")
    if type(live) is not int or type(sizes) is not list or any(type(n) is not int for n in sizes):
        raise TypeError("entry counts are not integers")
    if min([live, *sizes]) < 0 or live + sum(sizes) != len(entries):
        raise ValueError("entry counts do not match the entries")
    session_id = data["session_id"]
    if type(session_id) is not str:
        raise TypeError("session_id is not text")
    texts = [entry.decode("utf-8") for entry in entries]  # UnicodeDecodeError: a ValueError
    data["records"] = _entry_records(texts[:live], session_id)
    data["archive"] = []
    for size in sizes:
        data["archive"].append(_entry_records(texts[live : live + size], session_id))
        live += size
    return data


def _entry_records(entries: list[str], session_id: str) -> list[dict[str, Any]]:
    try:
        heads, payloads = read_entries(entries, session_id)
    except CorruptRecord:
        raise ValueError("an entry cannot be decoded") from None
    return [
        {
            "seq": _canonical_int(head[0]),
            "at_ms": _canonical_int(head[1]),
            "record": {
                "kind": (kind := CODE_KIND[payload[0]]),
                **dict(zip(FIELD_NAMES[kind], payload[1:], strict=True)),
            },
        }
        for head, payload in zip(heads, payloads, strict=True)
    ]


def _canonical_int(text: str) -> int:
    """An entry's number as Lua wrote it: ASCII digits, no sign, no leading zero
    (int() would also take ' 7', '+7', '1_0' and other scripts' digits)."""
    if not (text.isascii() and text.isdigit()) or (text[0] == "0" and len(text) > 1):
        raise ValueError("not a canonical number")
    return int(text)


def _digest(line: bytes) -> bytes:
    """What read_session() compares a line with: the line validate() checked."""
    return hashlib.blake2b(line, digest_size=16).digest()


def age_ms(last_active_ms: int, now_wall_ms: int) -> int:
    """Age by wall-clock time; a wall clock behind the last activity gives 0."""
    return max(0, now_wall_ms - last_active_ms)


def expired(session: SnapshotSession, now_wall_ms: int) -> bool:
    ttl = CHANNEL_TTL_MS[Channel(session.channel)]
    return age_ms(session.last_active_at_ms, now_wall_ms) >= ttl


def _write_chunk(fh: IO[bytes], digest: Any, lines: list[bytes]) -> int:
    """Write and hash lines as one block (a write and a hash update per line gave up
    and took back the GIL the export threads want, a few thousand times a flush)."""
    data = b"".join(lines)
    if data:
        _write_all(fh, data)
        digest.update(data)
    return len(data)


def _write_all(fh: IO[bytes], data: bytes) -> None:
    """Every write of a generation goes through here (tests inject ENOSPC / EIO)."""
    fh.write(data)


def _open_regular(path: Path) -> IO[bytes]:
    """Open a regular file for reading, never through a link and never waiting on a fifo.

    Raises OSError for anything else (ELOOP for a link, EINVAL for a non-file).
    """
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_BINARY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link"
    return str(exc.strerror or exc)


def _force_mode(path: Path, mode: int, *, directory: bool = False) -> str | None:
    """chmod through a descriptor opened without following a link (Unix only).

    An entry that is not what it should be (a link, a fifo) is left alone, and so
    is a regular file with other hard links: its mode is the mode of every name it
    has, outside the directory too. Returns "hard_linked" for such a file.
    """
    flags = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | (_O_DIRECTORY if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # a link (ELOOP), gone, or unreadable: not ours to fix
    try:
        info = os.fstat(fd)
        kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
        if not kind_ok or (info.st_mode & 0o777) == mode:
            return None
        if not directory and info.st_nlink > 1:
            return "hard_linked"
        try:
            os.fchmod(fd, mode)
        except OSError:
            if directory:
                raise
            return "chmod_failed"  # another user's file, a read-only mount: not ours to fix
        return None
    finally:
        os.close(fd)


def _fsync_directory(directory: Path, posix: bool) -> None:
    """Make a rename durable. Directories cannot be opened for fsync on Windows."""
    if not posix:
        return
    fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(
    exc: OSError, action: str, path: Path, existing: list[tuple[int, Path]]
) -> SnapshotError:
    code = errno.errorcode.get(exc.errno or 0, "error")
    kept = f"generation {existing[-1][0]} is kept" if existing else "no earlier generation exists"
    return SnapshotError(
        f"cannot {action} snapshot {path.name} in {path.parent}: "
        f"{exc.strerror or exc} ({code}); {kept}"
    )
