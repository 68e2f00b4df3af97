"""The worker service's stream calls, tested directly: every return shape and error code.

The queue's atomic steps are Lua scripts; ensure_group, dead_letter and
publish_reply are one plain command each, whose arguments the call's builder
checks (as the scripts did) before there is any command to send."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from gridmem.errors import BadScriptArgument
from gridmem.keys import KeySpace
from gridmem.records import DeadLetterReason
from gridmem.scripts import REJECTED_MEMBER
from gridmem.scripts import AttemptCount
from gridmem.scripts import KeyStep
from gridmem.scripts import Scripts
from gridmem.scripts import load_scripts
from gridmem.store import ConversationStore
from gridmem.stream_calls import OutboundReply
from tests.helpers import avatar

pytestmark = pytest.mark.both_doors  # every store test, through both doors

SCRIPTS = Scripts(load_scripts())
SERVICE = KeySpace().service()
A, B = avatar(1), avatar(2)
MA, MB = f"{A}:im", f"{B}:public"
NIL = REJECTED_MEMBER


def _rejected(redis: redis_py.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in redis.hgetall(SERVICE.rejected).items()}


@pytest.fixture
def run(store: ConversationStore) -> Any:
    return store.executor.call


def _add(redis: redis_py.Redis, **fields: str | bytes) -> str:
    return str(redis.xadd(SERVICE.inbound, fields).decode())  # type: ignore[union-attr]


def test_keys_share_the_inbound_slot() -> None:
    assert SERVICE.inbound == "gm:inbound" and SERVICE.ready == "{gm:inbound}:ready"
    assert SERVICE.attempts == "{gm:inbound}:attempts"
    assert SERVICE.rejected == "{gm:inbound}:rejected"
    assert (SERVICE.outbound, SERVICE.dead) == ("gm:outbound", "gm:dead")


def test_ensure_group(run: Any, redis: redis_py.Redis) -> None:
    assert run(SCRIPTS.ensure_group(SERVICE, group="workers")) is True
    assert run(SCRIPTS.ensure_group(SERVICE, group="workers")) is False
    assert redis.exists(SERVICE.inbound)
    assert [g["name"] for g in redis.xinfo_groups(SERVICE.inbound)] in (
        [b"workers"],
        ["workers"],
    )


def test_ensure_group_takes_only_busygroup_for_an_answer(run: Any, redis: redis_py.Redis) -> None:
    """BUSYGROUP says the group existed; any other error reply is an error still."""
    redis.set(SERVICE.inbound, "not a stream")
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
        run(SCRIPTS.ensure_group(SERVICE, group="workers"))


def test_take_files_entries_per_key_in_arrival_order(run: Any, redis: redis_py.Redis) -> None:
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    ids = [
        _add(redis, avatar_uuid=A.upper(), channel="im", text="1"),
        _add(redis, avatar_uuid=B, channel="public", text="2"),
        _add(redis, avatar_uuid=A, channel="im", text="3"),
        _add(redis, avatar_uuid="nope", channel="im", text="4"),
        _add(redis, avatar_uuid=A, channel="group", text="5"),
        _add(redis, channel="im", text="6"),
        _add(redis, avatar_uuid=NIL.split(":")[0], channel="public", text="7"),  # the nil UUID
    ]
    first = run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c1", count=2))
    second = run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c2", count=10))
    assert [(t.entry_id, t.member, t.reason) for t in first + second] == [
        (ids[0], MA, ""), (ids[1], MB, ""), (ids[2], MA, ""),
        (ids[3], NIL, "bad_uuid"), (ids[4], NIL, "bad_channel"), (ids[5], NIL, "missing_field"),
        (ids[6], NIL, "bad_uuid"),
    ]  # fmt: skip
    assert [x.decode() for x in redis.lrange("{gm:inbound}:mbox:" + MA, 0, -1)] == [ids[0], ids[2]]
    # entries without a valid key wait under the reserved key, their reasons recorded
    assert [x.decode() for x in redis.lrange("{gm:inbound}:mbox:" + NIL, 0, -1)] == ids[3:]
    assert {x.decode() for x in redis.smembers(SERVICE.ready)} == {MA, MB, NIL}
    assert _rejected(redis) == {
        ids[3]: "bad_uuid",
        ids[4]: "bad_channel",
        ids[5]: "missing_field",
        ids[6]: "bad_uuid",
    }
    assert run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c1", count=10)) == []


def test_take_without_group(run: Any, redis: redis_py.Redis) -> None:
    from gridmem.errors import NoConsumerGroup

    with pytest.raises(NoConsumerGroup, match="GM_NOGROUP missing"):
        run(SCRIPTS.take_inbound(SERVICE, group="missing", consumer="c", count=1))
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    with pytest.raises(NoConsumerGroup):  # the stream exists, the group does not
        run(SCRIPTS.take_inbound(SERVICE, group="missing", consumer="c", count=1))


def _filed(run: Any, redis: redis_py.Redis, n: int) -> list[str]:
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    ids = [_add(redis, avatar_uuid=A, channel="im", text=str(i)) for i in range(n)]
    run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=n))
    return ids


def _claim(run: Any, owner: str, also: str = "", member: str = MA) -> Any:
    return run(SCRIPTS.claim_key(SERVICE, member=member, owner=owner, lease_ms=10_000, also=also))


def _begin(
    run: Any, owner: str, entry: str, token: str, *, also: str = "", failed: str = ""
) -> Any:
    """begin_attempt's count (the entry's fields left out: _begin_fields has them)."""
    return dataclasses.replace(
        _begin_fields(run, owner, entry, token, also=also, failed=failed), fields=()
    )


def _begin_fields(
    run: Any, owner: str, entry: str, token: str, *, also: str = "", failed: str = ""
) -> Any:
    return run(
        SCRIPTS.begin_attempt(
            SERVICE, member=MA, owner=owner, entry_id=entry, token=token, also=also, failed=failed
        )
    )


def _finish(run: Any, entry: str, owner: str = "w1", release: bool = False) -> Any:
    return run(
        SCRIPTS.finish_entry(
            SERVICE,
            group="g",
            entry_id=entry,
            member=MA,
            owner=owner,
            lease_ms=10_000,
            release=release,
        )
    )


def _attempts(redis: redis_py.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in redis.hgetall(SERVICE.attempts).items()}


def test_claim_finish_walk_a_mailbox(run: Any, redis: redis_py.Redis) -> None:
    ids = _filed(run, redis, 3)
    step = _claim(run, "w1")
    assert step == KeyStep("ok", ids[0], 0, 0, "")  # a claim counts no attempt
    assert _claim(run, "w2").state == "busy"
    assert _claim(run, "w1").entry_id == ids[0]  # the owner may claim again: same head
    assert _attempts(redis) == {}
    assert _begin(run, "w1", ids[0], "t1") == AttemptCount("ok", 1, 0)

    first = _finish(run, ids[0])
    assert first == KeyStep("ok", ids[1], 0, 0, "")
    assert _finish(run, ids[0]) == first  # a resend hands over the same
    assert redis.xlen(SERVICE.inbound) == 2  # acknowledged and deleted: no raw words left
    assert _attempts(redis) == {}  # the finished entry's counter went with it
    assert _finish(run, ids[1], release=True).state == "released"
    assert run(SCRIPTS.orphaned_keys(SERVICE, sample=10)) == [MA]
    assert _claim(run, "w2").entry_id == ids[2]
    assert _begin(run, "w1", ids[2], "x") == AttemptCount("lost")  # w2 owns it now
    assert _finish(run, ids[2], owner="w1").state == "lost"
    assert _claim(run, "w2").state == "empty"
    assert not redis.exists("{gm:inbound}:owner:" + MA) and not redis.sismember(SERVICE.ready, MA)
    assert redis.xpending(SERVICE.inbound, "g")["pending"] == 0
    assert _attempts(redis) == {}  # bounded: nothing is left once every entry is finished


def test_attempts_count_new_tries_and_adoptions_not_resends(
    run: Any, redis: redis_py.Redis
) -> None:
    """Regression (issue 12, poison): attempts at an entry are counted in Redis when they
    start, across owners, so an entry that keeps failing or killing its worker can be
    dead-lettered; a resend or a resume after a connection fault counts nothing."""
    ids = _filed(run, redis, 2)
    # Given w1 starts an attempt, fails (a word: it raised), and tries again
    _claim(run, "w1")
    assert _begin(run, "w1", ids[0], "a") == AttemptCount("ok", 1, 0)
    assert _begin(run, "w1", ids[0], "a") == AttemptCount("ok", 1, 0)  # a resend
    assert _begin(run, "w1", ids[0], "b", failed="a") == AttemptCount("ok", 2, 0)
    assert _attempts(redis) == {ids[0]: "2:1:b"}
    # When w1 dies in attempt b (its lease runs out) and w2 adopts the key
    redis.delete("{gm:inbound}:owner:" + MA)
    adopted = _claim(run, "w2")
    # Then the claim shows two ended attempts, one of them without a word: a suspect
    assert (adopted.entry_id, adopted.attempts, adopted.silent) == (ids[0], 2, 1)
    assert _begin(run, "w2", ids[0], "c") == AttemptCount("ok", 3, 1)
    # And a resume naming the attempt in hand neither counts it nor calls it ended
    assert _claim(run, "w2", also="c") == KeyStep("ok", ids[0], 2, 1, "")
    assert _begin(run, "w2", ids[0], "d", also="c") == AttemptCount("ok", 3, 1)
    assert _attempts(redis) == {ids[0]: "3:1:d"}
    assert _begin(run, "w2", ids[0], "e", also="zzz").attempts == 4  # a stranger's token counts
    assert _begin(run, "w2", ids[0], "f", failed="zzz") == AttemptCount("ok", 5, 3)
    # And the hand-over to the next entry starts its own count, at none
    nxt = _finish(run, ids[0], owner="w2")
    assert (nxt.entry_id, nxt.attempts, nxt.silent) == (ids[1], 0, 0)
    assert _attempts(redis) == {}


def _claim_begin(run: Any, owner: str, token: str, *, also: str = "", most: int = 3) -> Any:
    return run(
        SCRIPTS.claim_key(
            SERVICE,
            member=MA,
            owner=owner,
            lease_ms=10_000,
            also=also,
            begin=token,
            max_attempts=most,
        )
    )


def test_a_claim_begins_an_attempt_at_an_ordinary_head_only(
    run: Any, redis: redis_py.Redis
) -> None:
    """Issue 16 (round trips): a claim asked to begin counts the attempt and reads the
    entry as begin_attempt does, in the same step; never at a suspect, a rejected
    entry or one out of attempts, which the worker must handle first."""
    ids = _filed(run, redis, 1)
    # an ordinary head: claimed and begun, the entry read as stored
    step = _claim_begin(run, "w1", "a")
    assert (step.state, step.entry_id, step.attempts, step.silent) == ("ok", ids[0], 0, 0)
    assert step.begun is not None
    assert (step.begun.state, step.begun.attempts, step.begun.silent) == ("ok", 1, 0)
    assert dict(step.begun.fields)[b"text"] == b"0"
    assert _attempts(redis) == {ids[0]: "1:0:a"}
    # a resend of the same claim counts nothing more
    assert _claim_begin(run, "w1", "a").begun == step.begun
    assert _attempts(redis) == {ids[0]: "1:0:a"}
    # the worker dies in attempt a: the next claim sees a suspect and begins nothing
    redis.delete("{gm:inbound}:owner:" + MA)
    suspect = _claim_begin(run, "w2", "b")
    assert (suspect.attempts, suspect.silent, suspect.begun) == (1, 1, None)
    assert _attempts(redis) == {ids[0]: "1:0:a"}
    # a resume naming the attempt in hand (after a connection fault) may begin it again,
    # uncounted, as begin_attempt's `also` does
    resumed = _claim_begin(run, "w1", "c", also="a")
    assert resumed.state == "busy"  # w2 holds the lease now
    redis.delete("{gm:inbound}:owner:" + MA)
    resumed = _claim_begin(run, "w1", "c", also="a")
    assert resumed.begun is not None and resumed.begun.attempts == 1
    assert _attempts(redis) == {ids[0]: "1:0:c"}
    # out of attempts: not begun (the worker dead-letters it as poison)
    redis.delete("{gm:inbound}:owner:" + MA)
    redis.hset(SERVICE.attempts, ids[0], "3:3:x")
    spent = _claim_begin(run, "w1", "d", most=3)
    assert (spent.attempts, spent.begun) == (3, None)
    # a rejection decided before a crash: not begun (the worker dead-letters it)
    redis.hset(SERVICE.attempts, ids[0], "0:0:")
    redis.hset(SERVICE.rejected, ids[0], "bad_text")
    rejected = _claim_begin(run, "w1", "e")
    assert (rejected.rejected, rejected.begun) == ("bad_text", None)
    # and without a token, a claim counts nothing, as before
    redis.hdel(SERVICE.rejected, ids[0])
    assert _claim(run, "w1").begun is None


def test_counters_written_before_the_word_count_are_read(run: Any, redis: redis_py.Redis) -> None:
    """A counter in the earlier '<attempts>:<token>' form (a worker of the previous
    version, same server) reads as that many attempts, all without a word."""
    ids = _filed(run, redis, 1)
    redis.hset(SERVICE.attempts, ids[0], "2:old.7")
    assert _claim(run, "w1") == KeyStep("ok", ids[0], 2, 2, "")
    assert _begin(run, "w1", ids[0], "n") == AttemptCount("ok", 3, 2)


def test_a_rejection_decided_before_a_crash_is_shown_to_the_next_claim(
    run: Any, redis: redis_py.Redis
) -> None:
    """Issue 12 item 2: the worker writes its rejection reason before the dead letter;
    the next claim of the key (or hand-over) shows it, and finish_entry deletes it."""
    ids = _filed(run, redis, 2)
    redis.hset(SERVICE.rejected, ids[0], "bad_encoding")
    redis.hset(SERVICE.rejected, ids[1], "oversized")
    assert _claim(run, "w1") == KeyStep("ok", ids[0], 0, 0, "bad_encoding")
    assert _finish(run, ids[0]) == KeyStep("ok", ids[1], 0, 0, "oversized")
    assert _finish(run, ids[1]).state == "empty"
    assert not redis.exists(SERVICE.rejected)


def test_finish_empty_and_done(run: Any, redis: redis_py.Redis) -> None:
    [only] = _filed(run, redis, 1)
    _claim(run, "w")
    step = run(
        SCRIPTS.finish_entry(
            SERVICE,
            group="g",
            entry_id=only,
            member=MA,
            owner="w",
            lease_ms=1,
            release=False,
        )
    )
    assert step.state == "empty" and not redis.exists("{gm:inbound}:owner:" + MA)
    bad = _add(redis, avatar_uuid="x", channel="im", text="t")
    run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=1))
    done = run(
        SCRIPTS.finish_entry(
            SERVICE,
            group="g",
            entry_id=bad,
            member="",
            owner="w",
            lease_ms=1,
            release=False,
        )
    )
    assert done.state == "done" and redis.xlen(SERVICE.inbound) == 0
    assert _attempts(redis) == {}


def test_renew_lease(run: Any, redis: redis_py.Redis) -> None:
    _filed(run, redis, 1)
    run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1000))
    assert run(SCRIPTS.renew_lease(SERVICE, member=MA, owner="w", lease_ms=90_000)) is True
    assert redis.pttl("{gm:inbound}:owner:" + MA) > 60_000
    assert run(SCRIPTS.renew_lease(SERVICE, member=MA, owner="other", lease_ms=90_000)) is False


def _take_one(run: Any, redis: redis_py.Redis, **fields: str | bytes) -> str:
    """File one entry under MA's key and claim the key as w1: the entry's ID."""
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    entry = _add(redis, **fields)
    run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=10))
    _claim(run, "w1")
    return entry


def test_begin_attempt_reads_the_entry_as_stored(run: Any, redis: redis_py.Redis) -> None:
    """Issue 16 (round trips): starting an attempt also reads the entry, every pair as
    Redis holds it; an entry gone meanwhile reads as no fields."""
    entry = _take_one(run, redis, avatar_uuid=A, channel="im", text="héllo")
    assert _begin_fields(run, "w1", entry, "t1").fields == (
        (b"avatar_uuid", A.encode()),
        (b"channel", b"im"),
        (b"text", "héllo".encode()),
    )
    redis.xdel(SERVICE.inbound, entry)
    assert _begin_fields(run, "w1", entry, "t2", failed="t1") == AttemptCount("ok", 2, 0, ())


def test_dead_letter_publish(run: Any, redis: redis_py.Redis) -> None:
    entry = _add(redis, avatar_uuid=A, channel="im", text="héllo")
    for _ in range(4):
        run(SCRIPTS.dead_letter(SERVICE, entry_id=entry, reason="oversized", max_entries=3))
    assert redis.xlen(SERVICE.dead) == 3
    [(_, fields)] = redis.xrange(SERVICE.dead, count=1)
    assert fields == {b"id": entry.encode(), b"reason": b"oversized"}
    run(SCRIPTS.publish_reply(SERVICE, OutboundReply(A, "im", "hi", entry, SID), max_entries=100))
    [(_, out)] = redis.xrange(SERVICE.outbound)
    assert out == _published(entry)


SID = "ab" * 16


def _published(entry: str, text: str = "hi") -> dict[bytes, bytes]:
    """A reply to `entry` as the bridge reads it from the outbound stream."""
    return {
        b"avatar_uuid": A.encode(),
        b"channel": b"im",
        b"text": text.encode(),
        b"in_reply_to": entry.encode(),
        b"session_id": SID.encode(),
    }


def test_finish_entry_publishes_the_reply_in_the_same_step(run: Any, redis: redis_py.Redis) -> None:
    """Issue 16 (round trips): with a reply, finish_entry puts it on the outbound stream
    and finishes the entry in one step; the call is not resent after a fault (a resend
    would publish twice), while a finish without a reply may be."""
    ids = _filed(run, redis, 2)
    _claim(run, "w1")
    reply = OutboundReply(A, "im", "héllo", ids[0], SID)
    finish = SCRIPTS.finish_entry(
        SERVICE, group="g", entry_id=ids[0], member=MA, owner="w1", lease_ms=10_000,
        release=False, reply=reply, max_replies=100,
    )  # fmt: skip
    assert not finish.idempotent and _finish_call(ids[0]).idempotent
    assert run(finish) == KeyStep("ok", ids[1], 0, 0, "")
    [(_, out)] = redis.xrange(SERVICE.outbound)
    assert out == _published(ids[0], "héllo")
    assert redis.xlen(SERVICE.inbound) == 1  # the answered entry went in the same step
    # And a key that passed to another worker meanwhile still gets its reply published
    redis.set("{gm:inbound}:owner:" + MA, "w2")
    late = dataclasses.replace(reply, in_reply_to=ids[1], text="late")
    lost = SCRIPTS.finish_entry(
        SERVICE, group="g", entry_id=ids[1], member=MA, owner="w1", lease_ms=10_000,
        release=False, reply=late, max_replies=100,
    )  # fmt: skip
    assert run(lost).state == "lost"
    assert [f[b"text"] for _, f in redis.xrange(SERVICE.outbound)] == [
        "héllo".encode(),
        b"late",
    ]


def _finish_call(entry: str) -> Any:
    return SCRIPTS.finish_entry(
        SERVICE, group="g", entry_id=entry, member=MA, owner="w1", lease_ms=10_000, release=False
    )


def test_read_backlog_counts_the_entries_not_answered_yet(run: Any, redis: redis_py.Redis) -> None:
    assert run(SCRIPTS.read_backlog(SERVICE)) == 0  # no stream yet
    entries = [_add(redis, avatar_uuid=A, channel="im", text=f"hi {n}") for n in range(3)]
    redis.xdel(SERVICE.inbound, entries[0])  # answered: deleted by finish_entry
    assert run(SCRIPTS.read_backlog(SERVICE)) == 2


def test_the_entry_read_returns_undecodable_bytes_as_they_are(
    run: Any, redis: redis_py.Redis
) -> None:
    """Regression (issue 12): one invalid UTF-8 byte in any field failed the whole read,
    before the entry could be dead-lettered. The read hands over bytes; the worker decodes."""
    entry = _take_one(
        run, redis, avatar_uuid=A, channel="im", text="hi", avatar_name=b"\xff\xfeAnn"
    )
    assert _begin_fields(run, "w1", entry, "t").fields[-1] == (b"avatar_name", b"\xff\xfeAnn")


def test_the_entry_read_returns_a_field_named_twice_with_both_values(
    run: Any, redis: redis_py.Redis
) -> None:
    """Regression: as a plain XRANGE, redis-py's reply parser kept only the last value of
    a field named twice, so a bad value hidden behind a good one was never checked."""
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    entry = redis.execute_command(
        "XADD", SERVICE.inbound, "*", "avatar_uuid", A, "channel", "im",
        "text", b"\xff bad", "text", "fine",
    ).decode()  # fmt: skip
    run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=10))
    _claim(run, "w1")
    assert _begin_fields(run, "w1", entry, "t").fields[2:] == (
        (b"text", b"\xff bad"),
        (b"text", b"fine"),
    )


def test_take_files_nothing_for_undecodable_uuid_or_channel(
    run: Any, redis: redis_py.Redis
) -> None:
    """Bad bytes where the key is named end as dead-letter reasons, never as an error."""
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    bad_uuid = _add(redis, avatar_uuid=A.encode()[:-1] + b"\xff", channel="im", text="x")
    bad_channel = _add(redis, avatar_uuid=A, channel=b"i\xc3m", text="x")
    taken = run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=10))
    assert [(t.entry_id, t.member, t.reason) for t in taken] == [
        (bad_uuid, NIL, "bad_uuid"),
        (bad_channel, NIL, "bad_channel"),
    ]
    assert {x.decode() for x in redis.smembers(SERVICE.ready)} == {NIL}


@pytest.mark.parametrize("reason", [code.value for code in DeadLetterReason])
def test_dead_letter_knows_every_reason(run: Any, redis: redis_py.Redis, reason: str) -> None:
    run(SCRIPTS.dead_letter(SERVICE, entry_id="5-1", reason=reason, max_entries=10))
    [(_, fields)] = redis.xrange(SERVICE.dead)
    assert fields == {b"id": b"5-1", b"reason": reason.encode()}


def test_the_stream_contract_lists_every_dead_letter_reason() -> None:
    """docs/streams.md's table of gm:dead reasons is DeadLetterReason, no more, no less."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "streams.md").read_text()
    section = doc.split("## `gm:dead`", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE)) == {
        code.value for code in DeadLetterReason
    }


def _BEGIN(**override: str) -> Any:
    args = {"member": MA, "owner": "w", "entry_id": "1-0", "token": "t", **override}
    return SCRIPTS.begin_attempt(SERVICE, **args)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=0), "count"),
        (SCRIPTS.take_inbound(SERVICE, group="g", consumer="", count=1), "consumer"),
        (SCRIPTS.claim_key(SERVICE, member="x", owner="w", lease_ms=1), "member"),
        (SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=0), "lease_ms"),
        (SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1, also="a b"), "also"),
        (SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1, also="a:b"), "also"),
        (SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1, begin="a b"), "begin"),
        (
            SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1, max_attempts=0),
            "max_attempts",
        ),
        (_BEGIN(token=""), "token"),
        (_BEGIN(token="a:b"), "token"),
        (_BEGIN(entry_id="x"), "entry_id"),
        (_BEGIN(member="x"), "member"),
        (_BEGIN(also="a b"), "also"),
        (_BEGIN(failed="a b"), "failed"),
        (
            SCRIPTS.finish_entry(
                SERVICE,
                group="g",
                entry_id="abc",
                member=MA,
                owner="w",
                lease_ms=1,
                release=False,
            ),
            "entry_id",
        ),
        (SCRIPTS.renew_lease(SERVICE, member=MA, owner="w w", lease_ms=1), "owner"),
        (SCRIPTS.orphaned_keys(SERVICE, sample=0), "sample"),
    ],
)
def test_bad_arguments(run: Any, redis: redis_py.Redis, call: Any, field: str) -> None:
    with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
        run(call)
    assert redis.dbsize() == 0


def _reply(max_entries: int = 1, **override: Any) -> Any:
    args = {
        "avatar_uuid": A, "channel": "im", "text": "t", "in_reply_to": "1-0",
        "session_id": SID, **override,
    }  # fmt: skip
    return SCRIPTS.publish_reply(SERVICE, OutboundReply(**args), max_entries=max_entries)


def _finish_with(max_replies: int = 1, **override: Any) -> Any:
    args = {
        "avatar_uuid": A, "channel": "im", "text": "t", "in_reply_to": "1-0",
        "session_id": SID, **override,
    }  # fmt: skip
    return SCRIPTS.finish_entry(
        SERVICE, group="g", entry_id="1-0", member=MA, owner="w", lease_ms=1, release=False,
        reply=OutboundReply(**args), max_replies=max_replies,
    )  # fmt: skip


def _dead(**override: Any) -> Any:
    args = {"entry_id": "1-0", "reason": "gone", "max_entries": 1, **override}
    return SCRIPTS.dead_letter(SERVICE, **args)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SCRIPTS.ensure_group(SERVICE, group="bad group"), "group"),
        (lambda: SCRIPTS.ensure_group(SERVICE, group=""), "group"),
        (lambda: _dead(reason="because"), "reason"),
        (lambda: _dead(reason="GONE"), "reason"),
        (lambda: _dead(reason="deleted_operator"), "reason"),  # an event's code, not a letter's
        (lambda: _dead(entry_id="1"), "entry_id"),
        (lambda: _dead(entry_id="1-0 "), "entry_id"),
        (lambda: _dead(max_entries=0), "max_entries"),
        (lambda: _dead(max_entries=True), "max_entries"),
        (lambda: _reply(avatar_uuid=A.upper()), "avatar_uuid"),
        (lambda: _reply(avatar_uuid="nope"), "avatar_uuid"),
        (lambda: _reply(channel="group"), "channel"),
        (lambda: _reply(channel="IM"), "channel"),
        (lambda: _reply(in_reply_to="x"), "in_reply_to"),
        (lambda: _reply(session_id="short"), "session_id"),
        (lambda: _reply(session_id="AB" * 16), "session_id"),
        (lambda: _reply(max_entries=0), "max_entries"),
        (lambda: _finish_with(avatar_uuid="nope"), "avatar_uuid"),
        (lambda: _finish_with(in_reply_to="x"), "in_reply_to"),
        (lambda: _finish_with(max_replies=0), "max_replies"),
    ],
)
def test_plain_command_calls_refuse_bad_arguments_before_any_command(
    build: Callable[[], Any], field: str
) -> None:
    """What the scripts checked, their builders check: a bad argument leaves nothing
    to send (the refusal names the field, as a script's GM_BADARG did)."""
    with pytest.raises(BadScriptArgument, match=f"^GM_BADARG {field}$"):
        build()


def test_read_receipt(store: ConversationStore) -> None:
    from gridmem import AvatarMessage

    first = store.record(A, "im", AvatarMessage(text="x"), idempotency_key="1-0")
    assert store.receipt(A, "im", "1-0") == first
    assert store.receipt(A, "im", "2-0") is None
    assert store.receipt(B, "im", "1-0") is None
