"""Each Lua script tested directly: every return shape and every error code.

Plus the meta-test: every script documents its contract, and the Python wrapper
passes exactly the KEYS the header declares.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from gridmem.config import Limits
from gridmem.errors import BadScriptArgument
from gridmem.errors import CorruptState
from gridmem.errors import ScriptError
from gridmem.executor import Executor
from gridmem.executor import translate
from gridmem.keys import KeySpace
from gridmem.records import Channel
from gridmem.scripts import LIMIT_FIELDS
from gridmem.scripts import SCRIPT_NAMES
from gridmem.scripts import ClockReading
from gridmem.scripts import Scripts
from gridmem.scripts import limits_packet
from gridmem.scripts import load_scripts
from gridmem.scripts import lua_dir
from gridmem.session_calls import shard_script_keys
from gridmem.stream_calls import OutboundReply
from tests.helpers import avatar
from tests.helpers import dump_all

SCRIPTS = load_scripts()
KEYSPACE = KeySpace()
A = avatar(1)
SESSION, SHARD = KEYSPACE.session(A, Channel.PUBLIC)
SERVICE = KEYSPACE.service()
PARTITIONED = KeySpace(partitions=2).service(0)
MEMBER = SESSION.member
SID = "ab" * 16
NOW = ("1000", "1767225600000", "boot-a")

Run = Callable[..., Any]


@pytest.fixture
def run(redis: redis_py.Redis) -> Run:
    def call(name: str, keys: list[str], args: list[Any]) -> Any:
        assert len(keys) == SCRIPTS[name].key_count
        try:
            return redis.eval(SCRIPTS[name].source, len(keys), *keys, *args)
        except redis_py.ResponseError as exc:
            raise translate(exc) from None

    return call


def _events(redis: redis_py.Redis) -> list[tuple[str, dict[str, str]]]:
    """The shard's events as store.events() reads them (gridmem/session_calls.py read_events)."""
    return Executor(redis).call(Scripts(SCRIPTS).read_events(SHARD, after="", count=10))


def _s(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [_s(x) for x in v]
    return v


# The shard scripts' one KEYS layout: a session's keys, then the shard's (or the shard's alone)
RECORD_KEYS = list(shard_script_keys(SHARD, SESSION))
LIMITS = limits_packet(Limits(), 1)


def record_args(**over: Any) -> list[Any]:
    args = {
        "now_mono": NOW[0], "now_wall": NOW[1], "boot_id": NOW[2], "member": MEMBER,
        "session_id": SID, "payload": '["a","hi"]', "idempotency_key": "", "redactions": 0,
        "truncated": 0, "max_events": 100, "limits": LIMITS, "required_session": "",
    }  # fmt: skip
    args.update(over)
    return list(args.values())


def _with_sweep_batch(batch: int) -> str:
    """LIMITS with another sweep_batch (the packet's last field)."""
    assert LIMIT_FIELDS[-1] == "sweep_batch"
    return f"{LIMITS.rsplit(',', 1)[0]},{batch}"


class TestRecordTurn:
    def test_new_then_existing_then_duplicate(self, run: Run) -> None:
        first = run("record_turn", RECORD_KEYS, record_args(idempotency_key="k1", redactions=2))
        assert _s(first) == [SID, 1, 1, 0, 2, 0]
        other = "cd" * 16
        assert _s(run("record_turn", RECORD_KEYS, record_args(session_id=other))) == [
            SID,
            2,
            0,
            0,
            0,
            0,
        ]
        dup = run("record_turn", RECORD_KEYS, record_args(idempotency_key="k1", truncated=1))
        assert _s(dup) == [SID, 1, 1, 1, 2, 0]

    def test_a_required_session_takes_the_record_only_while_it_is_live(
        self, run: Run, redis: redis_py.Redis
    ) -> None:
        """Issue 16: a model's reply goes only into the session whose context it answers;
        one that ended while the model was thinking must not start a new one with it."""
        run("record_turn", RECORD_KEYS, record_args())  # session SID, seq 1
        same = run("record_turn", RECORD_KEYS, record_args(required_session=SID))
        assert _s(same) == [SID, 2, 0, 0, 0, 0]
        before = dump_all(redis)
        other = run("record_turn", RECORD_KEYS, record_args(required_session="cd" * 16))
        assert _s(other) == ["", 0, 0, 0, 0, 0]
        assert dump_all(redis) == before  # nothing written
        # the session idle one TTL: it expires (as due), and nothing new starts
        later = record_args(now_mono=str(1000 + 1_800_000), session_id="ef" * 16)
        ended = run("record_turn", RECORD_KEYS, [*later[:-1], SID])
        assert _s(ended) == ["", 0, 0, 0, 0, 0]
        assert redis.exists(SESSION.meta, SESSION.turns) == 0
        assert redis.zcard(SHARD.sessions) == 0

    def test_expired_session_is_replaced(self, run: Run) -> None:
        run("record_turn", RECORD_KEYS, record_args())
        later = record_args(now_mono=str(1000 + 1_800_000), session_id="cd" * 16)
        assert _s(run("record_turn", RECORD_KEYS, later)) == ["cd" * 16, 2, 1, 0, 0, 0]

    def test_write_expires_other_idle_sessions_up_to_the_batch(
        self, run: Run, redis: redis_py.Redis
    ) -> None:
        # Given three sessions written at NOW (ties sort by member: avatar 1, 2, 3)
        others = [KEYSPACE.session(avatar(n), Channel.PUBLIC)[0] for n in (2, 3)]
        run("record_turn", RECORD_KEYS, record_args())
        for other in others:
            run("record_turn", [*other.all(), *RECORD_KEYS[5:]], record_args(member=other.member))
        # When a fourth resident writes exactly one TTL later, with sweep_batch 2
        writer, _ = KEYSPACE.session(avatar(9), Channel.PUBLIC)
        later = str(int(NOW[0]) + 1_800_000)
        reply = run(
            "record_turn",
            [*writer.all(), *RECORD_KEYS[5:]],
            record_args(now_mono=later, member=writer.member, limits=_with_sweep_batch(2)),
        )
        # Then its receipt is as before, and the two oldest are gone whole, with events
        assert _s(reply) == [SID, 4, 1, 0, 0, 0]
        assert _s(redis.zrange(SHARD.sessions, 0, -1)) == [others[1].member, writer.member]
        assert redis.exists(*SESSION.all(), *others[0].all()) == 0
        reasons = [_s(f[b"reason"]) for _, f in redis.xrange(SHARD.events)]
        assert reasons == ["expired_inactivity"] * 2
        kept = sum(int(redis.hget(s.meta, "bytes")) for s in (others[1], writer))
        assert int(redis.hget(SHARD.stats, "bytes")) == kept
        # And with sweep_batch 0 a write expires nobody else
        run(
            "record_turn",
            [*writer.all(), *RECORD_KEYS[5:]],
            record_args(now_mono=later, member=writer.member, limits=_with_sweep_batch(0)),
        )
        assert redis.zscore(SHARD.lru_public, others[1].member) is not None

    @pytest.mark.parametrize(
        ("packet", "message"),
        [
            (LIMITS.rsplit(",", 1)[0] + ",-1", "GM_BADARG limits.sweep_batch"),
            (LIMITS.replace(",", ",x", 1), "GM_BADARG limits.low_turns"),
            (LIMITS.replace(",", ",-1", 1), "GM_BADARG limits.low_turns"),
            ("", "GM_BADARG limits"),
        ],
    )
    def test_bad_limits_packet(
        self, run: Run, redis: redis_py.Redis, packet: str, message: str
    ) -> None:
        with pytest.raises(BadScriptArgument, match=message):
            run("record_turn", RECORD_KEYS, record_args(limits=packet))
        assert redis.dbsize() == 0

    def test_the_library_keeps_only_a_whole_limits_packet(self, redis: redis_py.Redis) -> None:
        """Args:limits keeps the last packet that parsed whole from one FCALL to the next
        (a function library's file-level state; EVAL, as `run`, keeps nothing): a bad
        packet sent after a good one, and again after itself, still fails and writes
        nothing; another good packet is read as itself, never as the one kept."""
        executor, scripts = Executor(redis), Scripts(SCRIPTS)

        def record(packet: str, seq_mono: int) -> object:
            clock = ClockReading(seq_mono, int(NOW[1]) + seq_mono, NOW[2])
            call = scripts.record_turn(
                SESSION, SHARD, clock, candidate_session_id=SID, payload='["a","hi"]',
                idempotency_key="", redactions=0, truncated=False, max_events=100,
                limits=packet,
            )  # fmt: skip
            return executor.call(call)

        # Given a good packet the library has parsed and kept
        record(LIMITS, 1000)
        before = dump_all(redis)
        # When bad packets follow, each twice, Then each fails and nothing is written
        for bad, message in [
            (LIMITS.rsplit(",", 1)[0] + ",-1", "GM_BADARG limits.sweep_batch"),
            (LIMITS.replace(",", ",x", 1), "GM_BADARG limits.low_turns"),
            ("1,2,3", "GM_BADARG limits"),
            (LIMITS + ",9", "GM_BADARG limits"),
            ("", "GM_BADARG limits"),
        ]:
            for _ in range(2):
                with pytest.raises(BadScriptArgument, match=message):
                    record(bad, 2000)
                assert dump_all(redis) == before
        # And a good packet of one turn a session is read as itself: the next turn folds
        one_turn = ",".join(["1", "1", *LIMITS.split(",")[2:]])
        record(one_turn, 3000)
        record(one_turn, 4000)
        assert int(redis.hget(SESSION.meta, "turns")) == 1
        # while the first packet, sent again, keeps every turn
        record(LIMITS, 5000)
        assert int(redis.hget(SESSION.meta, "turns")) == 2

    def test_corrupt_idempotency_receipt(self, run: Run, redis: redis_py.Redis) -> None:
        run("record_turn", RECORD_KEYS, record_args())
        redis.hset(SESSION.idem, "k", "garbage")
        with pytest.raises(CorruptState, match="GM_CORRUPT idem"):
            run("record_turn", RECORD_KEYS, record_args(idempotency_key="k"))

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("now_mono", "x"), ("now_mono", "-1"), ("now_mono", "1.5"), ("now_wall", ""),
            ("boot_id", "has space"), ("member", "nope"), ("member", f"{A}:group"),
            ("member", f"{A.upper()}:public"), ("session_id", "short"), ("payload", "{}"),
            ("idempotency_key", "bad key"), ("redactions", "-1"), ("truncated", "2"),
            ("max_events", "0"), ("limits", "1,2,3"), ("limits", LIMITS + ",9"),
            ("required_session", "short"), ("required_session", "AB" * 16),
        ],
    )  # fmt: skip
    def test_bad_arguments_write_nothing(
        self, run: Run, redis: redis_py.Redis, field: str, value: str
    ) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("record_turn", RECORD_KEYS, record_args(**{field: value}))
        assert redis.dbsize() == 0


PAGE_KEYS = [SESSION.meta, SESSION.turns, SESSION.archive, SHARD.lru_public, SHARD.clock]


class TestReadPage:
    def test_shapes(self, run: Run, redis: redis_py.Redis) -> None:
        assert _s(run("read_page", PAGE_KEYS, [*NOW, MEMBER, "", "backward", 10])) == [0]
        for _ in range(3):
            run("record_turn", RECORD_KEYS, record_args())
        # an archived record joins the walk, once, in sequence order
        redis.zadd(SESSION.archive, {f'0|1|{SID}|["a","old"]': 0, f'2|1|{SID}|["a","dup"]': 2})
        whole = _s(run("read_page", PAGE_KEYS, [*NOW, MEMBER, "", "forward", 10]))
        assert [e.split("|")[0] for e in whole[1:]] == ["0", "1", "2", "3"]
        redis.delete(SESSION.archive)
        back = _s(run("read_page", PAGE_KEYS, [*NOW, MEMBER, "", "backward", 2]))
        assert back[0] == 1 and [e.split("|")[0] for e in back[1:]] == ["2", "3"]
        fwd = _s(run("read_page", PAGE_KEYS, [*NOW, MEMBER, "1", "forward", 2]))
        assert fwd[0] == 0 and [e.split("|")[0] for e in fwd[1:]] == ["2", "3"]

    @pytest.mark.parametrize(
        ("field", "args"),
        [
            ("anchor", [*NOW, MEMBER, "x", "backward", 5]),
            ("direction", [*NOW, MEMBER, "", "up", 5]),
            ("limit", [*NOW, MEMBER, "", "forward", 0]),
            ("limit", [*NOW, MEMBER, "", "forward", 201]),
            ("member", [*NOW, "x", "", "forward", 5]),
        ],
    )
    def test_bad_arguments(self, run: Run, field: str, args: list[Any]) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("read_page", PAGE_KEYS, args)


LIST_KEYS = [SHARD.sessions, SHARD.lru_public, SHARD.lru_im, SHARD.clock]


class TestListMetadata:
    def test_shapes(self, run: Run) -> None:
        assert _s(run("list_metadata", LIST_KEYS, [*NOW, "", 10])) == [""]
        run("record_turn", RECORD_KEYS, record_args())
        b_session, _ = KEYSPACE.session(avatar(2), Channel.PUBLIC)
        run(
            "record_turn",
            [*b_session.all(), *RECORD_KEYS[5:]],
            record_args(member=b_session.member),
        )
        first = _s(run("list_metadata", LIST_KEYS, [*NOW, "", 1]))
        assert first[0] == MEMBER
        assert first[1][:2] == [MEMBER, SID] and first[1][4] == "1"
        rest = _s(run("list_metadata", LIST_KEYS, [*NOW, MEMBER, 1]))
        assert rest[0] == "" and rest[1][0] == b_session.member

    @pytest.mark.parametrize(
        ("field", "args"),
        [("after", [*NOW, "zzz", 5]), ("limit", [*NOW, "", 0]), ("limit", [*NOW, "", 1001])],
    )
    def test_bad_arguments(self, run: Run, field: str, args: list[Any]) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("list_metadata", LIST_KEYS, args)


SWEEP_KEYS = list(shard_script_keys(SHARD))


class TestSweepIdle:
    def test_shapes(self, run: Run, redis: redis_py.Redis) -> None:
        run("record_turn", RECORD_KEYS, record_args())
        assert run("sweep_idle", SWEEP_KEYS, [*NOW, 10, 100]) == 0
        later = [str(1000 + 1_800_000), NOW[1], NOW[2], 10, 100]
        assert run("sweep_idle", SWEEP_KEYS, later) == 1
        assert not any(":s:" in k.decode() for k in redis.keys("*"))

    @pytest.mark.parametrize(
        ("field", "args"),
        [("batch", [*NOW, 0, 100]), ("batch", [*NOW, 1001, 100]), ("max_events", [*NOW, 5, 0])],
    )
    def test_bad_arguments(self, run: Run, field: str, args: list[Any]) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("sweep_idle", SWEEP_KEYS, args)


DELETE_KEYS = RECORD_KEYS


class TestPopNewest:
    def test_shapes(self, run: Run, redis: redis_py.Redis) -> None:
        # Given two records: the newest is popped, then the last one ends the session
        assert _s(run("pop_newest", RECORD_KEYS, [*NOW, MEMBER, 100])) == [0, "", 0]
        run("record_turn", RECORD_KEYS, record_args())
        run("record_turn", RECORD_KEYS, record_args(payload='["r","two"]'))
        newest = redis.zrange(SESSION.turns, -1, -1)[0].decode()
        assert _s(run("pop_newest", RECORD_KEYS, [*NOW, MEMBER, 100])) == [1, newest, 0]
        oldest = redis.zrange(SESSION.turns, 0, 0)[0].decode()
        assert _s(run("pop_newest", RECORD_KEYS, [*NOW, MEMBER, 100])) == [1, oldest, 1]
        assert _s(run("pop_newest", RECORD_KEYS, [*NOW, MEMBER, 100])) == [0, "", 0]
        first, second = _events(redis)
        assert first[1] == {
            "reason": "popped_newest", "at": NOW[1], "sid": SID, "uuid": A, "ch": "public",
            "seq": "2", "bytes": str(len(newest.encode())), "turns": "1",
        }  # fmt: skip
        assert second[1]["reason"] == "popped_newest" and second[1]["turns"] == "1"
        assert not redis.exists(*SESSION.all()) and redis.hget(SHARD.stats, "bytes") == b"0"

    @pytest.mark.parametrize(
        ("field", "args"),
        [
            ("now_mono", ["x", *NOW[1:], MEMBER, 100]),
            ("boot_id", [*NOW[:2], "bad boot", MEMBER, 100]),
            ("member", [*NOW, "x", 100]),
            ("member", [*NOW, A + ":group", 100]),
            ("max_events", [*NOW, MEMBER, 0]),
        ],
    )
    def test_bad_arguments(
        self, run: Run, redis: redis_py.Redis, field: str, args: list[Any]
    ) -> None:
        run("record_turn", RECORD_KEYS, record_args())
        before = dump_all(redis)
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("pop_newest", RECORD_KEYS, args)
        assert dump_all(redis) == before


class TestDeleteSession:
    def test_shapes(self, run: Run, redis: redis_py.Redis) -> None:
        run("record_turn", RECORD_KEYS, record_args())
        assert run("delete_session", DELETE_KEYS, [NOW[1], MEMBER, "deleted_operator", 100]) == 1
        assert run("delete_session", DELETE_KEYS, [NOW[1], MEMBER, "expired_operator", 100]) == 0
        [(_, fields)] = _events(redis)
        assert fields == {
            "reason": "deleted_operator", "at": NOW[1], "sid": SID, "uuid": A,
            "ch": "public", "turns": "1", "bytes": fields["bytes"],
        }  # fmt: skip

    @pytest.mark.parametrize(
        ("field", "args"),
        [
            ("reason", [NOW[1], MEMBER, "evicted_session_limit", 100]),
            ("reason", [NOW[1], MEMBER, "nope_operator", 100]),
            ("member", [NOW[1], "x", "deleted_operator", 100]),
            ("now_wall", ["x", MEMBER, "deleted_operator", 100]),
            ("max_events", [NOW[1], MEMBER, "deleted_operator", -1]),
        ],
    )
    def test_bad_arguments(self, run: Run, field: str, args: list[Any]) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("delete_session", DELETE_KEYS, args)


# -- meta-tests -------------------------------------------------------------------


def _wrapper_calls() -> dict[str, Any]:
    s = Scripts(SCRIPTS)
    clock = ClockReading(0, 0, "b")
    return {
        "record_turn": s.record_turn(
            SESSION, SHARD, clock, candidate_session_id=SID, payload="[]",
            idempotency_key="", redactions=0, truncated=False, max_events=1, limits=LIMITS,
        ),
        "read_page": s.read_page(
            SESSION, SHARD, SHARD.lru_public, clock, anchor=None, direction="forward", limit=1
        ),
        "read_context": s.read_context(SESSION, SHARD, SHARD.lru_public, ("last", "wall")),
        "list_metadata": s.list_metadata(SHARD, clock, after="", limit=1),
        "sweep_idle": s.sweep_idle(SHARD, clock, batch=1, max_events=1),
        "delete_session": s.delete_session(
            SESSION, SHARD, now_wall=0, reason="deleted_operator", max_events=1
        ),
        "pop_newest": s.pop_newest(SESSION, SHARD, clock, max_events=1),
        "export_sessions": s.export_sessions(SHARD, clock, after="", max_sessions=1, max_bytes=1),
        "restore_session": s.restore_session(
            SESSION, SHARD, clock, session_id=SID, created_ms=0, active_ms=0, age_ms=0, summary="",
            max_events=1, limits=LIMITS, receipts={}, entries=[],
        ),
        "publish_event": s.publish_event(SHARD, now_wall=0, reason="snapshot_restored", max_events=1),
        "read_receipt": s.read_receipt(SESSION, SHARD, SHARD.lru_public, clock, key="k"),
        "publish_layout": s.publish_layout("gm:layout", namespace="gm", prefixes=["gm:{0}:"]),
        "take_inbound": s.take_inbound(SERVICE, group="g", consumer="c", count=1),
        "claim_key": s.claim_key(SERVICE, member=MEMBER, owner="w", lease_ms=1),
        "begin_attempt": s.begin_attempt(
            SERVICE, member=MEMBER, owner="w", entry_id="1-0", token="t"
        ),
        "finish_entry": s.finish_entry(
            SERVICE, group="g", entry_id="1-0", member=MEMBER, owner="w", lease_ms=1, release=False,
        ),
        "publish_and_finish": s.finish_entry(  # where it is used: outbound in the slot
            PARTITIONED, group="g", entry_id="1-0", member=MEMBER, owner="w", lease_ms=1, release=False,
            reply=OutboundReply(A, "public", "t", "1-0", SID), max_replies=1,
        ),
        "renew_lease": s.renew_lease(SERVICE, member=MEMBER, owner="w", lease_ms=1),
        "orphaned_keys": s.orphaned_keys(SERVICE, sample=1),
        "read_backlog": s.read_backlog(SERVICE),
    }  # fmt: skip


def test_every_lua_file_is_known_and_has_a_wrapper() -> None:
    files = {p.stem for p in lua_dir().glob("*.lua")} - {"lib"}
    assert files == set(SCRIPT_NAMES) == set(_wrapper_calls())


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_contract_header_and_key_count(name: str) -> None:
    body = (lua_dir() / f"{name}.lua").read_text()
    header = body.split("\n\n", 1)[0]
    assert header.startswith(f"-- {name}: ")
    assert all(line.startswith("--") for line in header.splitlines())
    assert "-- Returns:" in header and "-- Errors:" in header and "-- Flags:" in header
    if "Read-only" in header:
        assert SCRIPTS[name].flags == ("no-writes",)
    declared = [int(n) for n in re.findall(r"^-- KEYS\[(\d+)\]", header, re.MULTILINE)]
    assert declared == list(range(1, len(declared) + 1)) and declared
    code = body.split("\n\n", 1)[1]
    used_keys = {int(n) for n in re.findall(r"\bKEYS\[(\d+)\]", code)}
    if "args:shard_keys(KEYS" in code:  # the shard scripts' layout, read by name
        assert used_keys == set()
        assert _declared_key_names(header) == _key_templates(_wrapper_calls()[name].keys)
    else:
        assert used_keys == set(declared)
    documented_argv = {int(n) for n in re.findall(r"^-- ARGV\[(\d+)\]", header, re.MULTILINE)}
    used_argv = {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", body.split("\n\n", 1)[1])}
    assert used_argv == documented_argv
    call = _wrapper_calls()[name]
    assert len(call.keys) == SCRIPTS[name].key_count == len(declared)
    variadic = re.search(r"^-- ARGV\[\d+[^\]]*\.\.\]", header, re.MULTILINE) is not None
    if variadic:  # a tail of pairs or records after the fixed arguments
        assert len(call.args) >= len(documented_argv)
    else:
        assert len(call.args) == len(documented_argv)


def _declared_key_names(header: str) -> list[str]:
    """The key names a header declares, in KEYS order: 'gm:{shard}:s:<uuid>:<ch>:meta', ..."""
    return re.findall(r"^-- KEYS\[\d+\]\s*=\s*(\S+)", header, re.MULTILINE)


def _key_templates(keys: tuple[str, ...]) -> list[str]:
    """A wrapper's keys (shard 0, MEMBER's session) written as the headers write them."""
    return [k.replace("{0}", "{shard}").replace(MEMBER, "<uuid>:<ch>") for k in keys]


SHARD_SCRIPTS = ["record_turn", "restore_session", "sweep_idle", "delete_session", "pop_newest"]


@pytest.mark.parametrize("name", SHARD_SCRIPTS)
def test_every_shard_script_takes_the_one_keys_layout(name: str) -> None:
    """Regression (issue 14): the scripts that keep a shard took their shard's keys in
    orders and sets of their own (sweep_idle and delete_session fewer than the writers).
    Now each reads one layout by name: the session's keys where it has one, then the
    shard's, SHARD_PARTS in order, as session_calls.shard_script_keys builds them."""
    from gridmem.keys import SESSION_PARTS
    from gridmem.keys import SHARD_PARTS

    call = _wrapper_calls()[name]
    has_session = name != "sweep_idle"
    assert call.keys == shard_script_keys(SHARD, SESSION if has_session else None)
    parts = [*(SESSION_PARTS if has_session else ()), *SHARD_PARTS]
    assert call.keys == tuple(getattr(SESSION if p in SESSION_PARTS else SHARD, p) for p in parts)
    assert "args:shard_keys(KEYS" in (lua_dir() / f"{name}.lua").read_text()


@pytest.mark.parametrize(
    ("name", "keys", "args"),
    [
        # delete_session as bin/gridmem-cli called it before: ten keys, no seq or clock
        ("delete_session", [*RECORD_KEYS[:8], *RECORD_KEYS[10:]], [NOW[1], MEMBER, "deleted_operator", 100]),
        ("delete_session", SWEEP_KEYS, [NOW[1], MEMBER, "deleted_operator", 100]),
        ("sweep_idle", [*SWEEP_KEYS[:3], *SWEEP_KEYS[4:]], [*NOW, 10, 100]),  # no seq, as before
        ("sweep_idle", RECORD_KEYS, [*NOW, 10, 100]),
        ("record_turn", RECORD_KEYS[:-1], record_args()),
    ],
)  # fmt: skip
def test_a_shard_script_refuses_keys_out_of_the_layout(
    redis: redis_py.Redis, name: str, keys: list[str], args: list[Any]
) -> None:
    # Given a session (when the call under test is not the one that would write it)
    if name != "record_turn":
        redis.eval(SCRIPTS["record_turn"].source, len(RECORD_KEYS), *RECORD_KEYS, *record_args())
    before = dump_all(redis)
    # When a script gets KEYS in another layout: refused before its first write
    with pytest.raises(BadScriptArgument, match=r"^GM_BADARG keys$"):
        try:
            redis.eval(SCRIPTS[name].source, len(keys), *keys, *args)
        except redis_py.ResponseError as exc:
            raise translate(exc) from None
    assert dump_all(redis) == before


def test_wrapper_keys_share_one_cluster_slot() -> None:
    """Every script's KEYS hash to one slot: a shard's tag, or the inbound stream's."""
    for name, call in _wrapper_calls().items():
        tags = {m.group(1) if (m := re.search(r"\{([^}]*)\}", k)) else k for k in call.keys}
        assert len(tags) == 1, name


def test_script_errors_map_to_one_class_each() -> None:
    from gridmem.errors import SCRIPT_ERRORS

    assert len(set(SCRIPT_ERRORS.values())) == len(SCRIPT_ERRORS)
    assert all(issubclass(cls, ScriptError) for cls in SCRIPT_ERRORS.values())
    lua_codes = set()
    for path in lua_dir().glob("*.lua"):
        lua_codes |= set(re.findall(r"GM_[A-Z]+", path.read_text()))
    assert lua_codes == set(SCRIPT_ERRORS)


EXPORT_KEYS = [SHARD.sessions, SHARD.lru_public, SHARD.lru_im, SHARD.clock]


class TestExportSessions:
    def test_shapes(self, run: Run) -> None:
        assert _s(run("export_sessions", EXPORT_KEYS, [*NOW, "", 10, 1 << 20])) == [""]
        run("record_turn", RECORD_KEYS, record_args(idempotency_key="k1"))
        run("record_turn", RECORD_KEYS, record_args(payload='["r","yo"]'))
        b_session, _ = KEYSPACE.session(avatar(2), Channel.PUBLIC)
        run(
            "record_turn",
            [*b_session.all(), *RECORD_KEYS[5:]],
            record_args(member=b_session.member),
        )
        whole = _s(run("export_sessions", EXPORT_KEYS, [*NOW, "", 10, 1 << 20]))
        assert whole[0] == "" and len(whole) == 3
        member, sid, created, active, summary, entries, receipts, segments, archived = whole[1]
        assert (segments, archived) == ("", [])
        assert (member, sid, created, active, summary) == (MEMBER, SID, NOW[1], NOW[1], "")
        assert [e.split("|")[0] for e in entries] == ["1", "2"] and receipts == ["k1", "1:1:0:0"]
        # a batch stops at max_sessions, or once max_bytes were read
        assert _s(run("export_sessions", EXPORT_KEYS, [*NOW, "", 1, 1 << 20]))[0] == MEMBER
        assert _s(run("export_sessions", EXPORT_KEYS, [*NOW, "", 10, 1]))[0] == MEMBER
        assert len(_s(run("export_sessions", EXPORT_KEYS, [*NOW, MEMBER, 10, 1]))) == 2
        expired = [str(1000 + 1_800_000), NOW[1], NOW[2], "", 10, 1 << 20]
        assert _s(run("export_sessions", EXPORT_KEYS, expired)) == [""]

    @pytest.mark.parametrize(
        ("field", "args"),
        [
            ("after", [*NOW, "x", 5, 100]),
            ("max_sessions", [*NOW, "", 0, 100]),
            ("max_sessions", [*NOW, "", 1001, 100]),
            ("max_bytes", [*NOW, "", 5, 0]),
        ],
    )
    def test_bad_arguments(self, run: Run, field: str, args: list[Any]) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("export_sessions", EXPORT_KEYS, args)


def restore_args(**over: Any) -> list[Any]:
    entries = over.pop(
        "entries", [f'7|{NOW[1]}|{SID}|["a","back"]', f'9|{NOW[1]}|{SID}|["t","map","x"]']
    )
    receipts = over.pop("receipts", ["k9", "9:0:0:0"])
    args = {
        "now_mono": NOW[0], "now_wall": NOW[1], "boot_id": NOW[2], "member": MEMBER,
        "session_id": SID, "created_ms": NOW[1], "active_ms": NOW[1], "age_ms": 5000,
        "summary": "- agent: hi", "max_events": 100, "limits": LIMITS, "receipts": len(receipts) // 2,
        "segments": "", "archive": 0,
    }  # fmt: skip
    archive = over.pop("archive_entries", [])
    args.update(over)
    if archive:
        args["archive"] = len(archive)
    return [*args.values(), *receipts, *archive, *entries]


class TestRestoreSession:
    def test_restores_an_archive(self, run: Run, redis: redis_py.Redis) -> None:
        old = f'3|1|{SID}|["a","archived"]'
        args = restore_args(segments=f"3-3-{len(old)}", archive_entries=[old])
        assert run("restore_session", RECORD_KEYS, args) == 1
        assert redis.zrange(SESSION.archive, 0, -1) == [old.encode()]
        meta = {k.decode(): v.decode() for k, v in redis.hgetall(SESSION.meta).items()}
        assert (meta["segments"], meta["abytes"]) == (f"3-3-{len(old)}", str(len(old)))
        assert int(redis.hget(SHARD.stats, "bytes")) == int(meta["bytes"]) + len(old)

    def test_restores_then_never_overwrites(self, run: Run, redis: redis_py.Redis) -> None:
        assert run("restore_session", RECORD_KEYS, restore_args()) == 1
        meta = {k.decode(): v.decode() for k, v in redis.hgetall(SESSION.meta).items()}
        assert (meta["sid"], meta["turns"], meta["tools"]) == (SID, "2", "1")
        assert int(redis.zscore(SHARD.lru_public, MEMBER)) == 1000 - 5000
        assert int(redis.get(SHARD.seq)) == 9
        assert redis.hget(SESSION.idem, "k9") == b"9:0:0:0"
        stored = sum(len(e) for e in redis.zrange(SESSION.turns, 0, -1)) + redis.strlen(
            SESSION.summary
        )
        assert int(meta["bytes"]) == int(redis.hget(SHARD.stats, "bytes")) == stored
        assert run("restore_session", RECORD_KEYS, restore_args(summary="")) == 0
        assert redis.get(SESSION.summary) == b"- agent: hi"

    @pytest.mark.parametrize(
        ("field", "over"),
        [
            ("records", {"entries": []}),
            ("records", {"entries": ["2|1|" + SID + '|["a","x"]', "2|1|" + SID + '|["a","y"]']}),
            ("records", {"entries": ["1|1|" + "cd" * 16 + '|["a","x"]']}),
            ("records", {"entries": ["not a record"]}),
            ("age_ms", {"age_ms": 1_800_000}),
            ("session_id", {"session_id": "XYZ"}),
            ("receipt", {"receipts": ["k", "garbage"]}),
            ("limits", {"limits": "1,2"}),
            ("segments", {"segments": "1-1-99", "archive_entries": [f'1|1|{SID}|["a","x"]']}),
            ("records", {"segments": "8-8-27", "archive_entries": [f'8|1|{SID}|["a","x"]']}),
        ],
    )
    def test_bad_arguments_write_nothing(
        self, run: Run, redis: redis_py.Redis, field: str, over: dict[str, Any]
    ) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("restore_session", RECORD_KEYS, restore_args(**over))
        assert redis.dbsize() == 0


class TestPublishEvent:
    def test_shapes(self, run: Run, redis: redis_py.Redis) -> None:
        event_id = _s(
            run(
                "publish_event",
                [SHARD.events, SHARD.stats],
                [NOW[1], "snapshot_restored", 10, "", "", "generation", 3],
            )
        )
        [(first, fields)] = _events(redis)
        assert first == event_id
        assert fields == {
            "reason": "snapshot_restored", "at": NOW[1], "sid": "", "uuid": "", "ch": "", "generation": "3",
        }  # fmt: skip
        run(
            "publish_event",
            [SHARD.events, SHARD.stats],
            [NOW[1], "expired_inactivity", 10, SID, MEMBER],
        )
        [_, (_, fields)] = _events(redis)
        assert (fields["sid"], fields["uuid"], fields["ch"]) == (SID, A, "public")
        stats = redis.hgetall(SHARD.stats)  # all-time counts, beside the bounded stream
        assert (stats[b"events:snapshot_restored"], stats[b"events:expired_inactivity"]) == (
            b"1",
            b"1",
        )

    @pytest.mark.parametrize(
        ("field", "args"),
        [
            ("reason", [NOW[1], "compacted", 10, "", ""]),
            ("reason", [NOW[1], "deleted_operator", 10, "", ""]),
            ("detail", [NOW[1], "snapshot_restored", 10, "", "", "odd"]),
            ("detail", [NOW[1], "snapshot_restored", 10, "", "", "reason", "x"]),
            ("detail", [NOW[1], "snapshot_restored", 10, "", "", "note", "has space"]),
            ("member", [NOW[1], "snapshot_restored", 10, "", "bad"]),
            ("session_id", [NOW[1], "snapshot_restored", 10, "short", ""]),
        ],
    )
    def test_bad_arguments(
        self, run: Run, redis: redis_py.Redis, field: str, args: list[Any]
    ) -> None:
        with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
            run("publish_event", [SHARD.events, SHARD.stats], args)
        assert redis.dbsize() == 0


def test_a_script_must_state_its_flags(tmp_path: Path) -> None:
    """Flags decide how a full server treats a script: no script gets them by default."""
    for path in lua_dir().glob("*.lua"):
        (tmp_path / path.name).write_text(path.read_text())
    body = (tmp_path / "read_backlog.lua").read_text()
    (tmp_path / "read_backlog.lua").write_text(
        "\n".join(line for line in body.splitlines() if not line.startswith("-- Flags:"))
    )
    with pytest.raises(ValueError, match=r"read_backlog\.lua: its header needs"):
        load_scripts(tmp_path)


def test_the_prelude_is_what_lua_uses(redis: redis_py.Redis) -> None:
    """The constants Lua shares with Python come from the generated prelude alone: each
    script's code starts with it, lib.lua defines none of them, the values Lua reads are
    the Python ones, and bin/gridmem-cli's copy (lua/generated/prelude.lua) is it."""
    import json

    from gridmem.clock import MAX_BOOT_ID_CHARS
    from gridmem.clock import MAX_CLOCK_BOOTS
    from gridmem.keys import SESSION_PARTS
    from gridmem.keys import SHARD_PARTS
    from gridmem.kinds import KINDS
    from gridmem.library import PRELUDE_FILE
    from gridmem.library import prelude
    from gridmem.records import CHANNEL_TTL_MS
    from gridmem.records import DeadLetterReason
    from gridmem.records import ReasonCode

    generated = prelude()
    assert all(script.source.startswith(generated) for script in SCRIPTS.values())
    assert generated in SCRIPTS["record_turn"].library.code
    assert (lua_dir() / PRELUDE_FILE).read_text(encoding="utf-8") == generated
    names = re.findall(r"^local (\w+) =", generated, re.MULTILINE)
    lib = (lua_dir() / "lib.lua").read_text(encoding="utf-8")
    assert [n for n in names if re.search(rf"^local {n}\b", lib, re.MULTILINE)] == []
    probe = (
        SCRIPTS["read_backlog"].source.replace("return redis.call('XLEN', KEYS[1])", "")
        + "\nreturn cjson.encode({ttl = TTL_MS, parts = SESSION_PARTS, shard = SHARD_PARTS,"
        " limits = LIMIT_FIELDS,"
        " boot = MAX_BOOT_ID_CHARS, boots = MAX_CLOCK_BOOTS, code = KIND_CODE, head = KIND_HEAD,"
        " reason = REASON, dead = DEAD})"
    )
    seen = json.loads(_s(redis.eval(probe, 0)))
    assert seen["ttl"] == {str(k): v for k, v in CHANNEL_TTL_MS.items()}
    assert tuple(seen["parts"]) == SESSION_PARTS
    assert tuple(seen["shard"]) == SHARD_PARTS
    assert tuple(seen["limits"]) == LIMIT_FIELDS
    assert (seen["boot"], seen["boots"]) == (MAX_BOOT_ID_CHARS, MAX_CLOCK_BOOTS)
    assert seen["code"] == {k.name: k.code for k in KINDS}
    assert seen["head"] == {k.code: list(k.head) for k in KINDS}
    assert seen["reason"] == {code.value: code.value for code in ReasonCode}
    assert seen["dead"] == {code.value: code.value for code in DeadLetterReason}


def test_no_lua_file_spells_a_reason_code() -> None:
    """Event reason codes come from the prelude's REASON table (gridmem/records.py
    ReasonCode), dead-letter ones from its DEAD table (DeadLetterReason): a Lua string
    literal of one would be a second definition."""
    from gridmem.records import DeadLetterReason
    from gridmem.records import ReasonCode

    codes = "|".join(code.value for code in [*ReasonCode, *DeadLetterReason])
    literal = re.compile(rf"['\"]({codes})['\"]")
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(lua_dir().glob("*.lua"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if not line.lstrip().startswith("--") and literal.search(line)
    ]
    assert offenders == []
