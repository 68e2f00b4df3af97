"""The worker service's Lua scripts, tested directly: every return shape and error code."""

from __future__ import annotations

from typing import Any

import pytest
import redis as redis_py

from tests.helpers import avatar
from worker.errors import BadScriptArgument
from worker.keys import KeySpace
from worker.scripts import Scripts, load_scripts
from worker.store import ConversationStore

SCRIPTS = Scripts(load_scripts())
SERVICE = KeySpace().service()
A, B = avatar(1), avatar(2)
MA, MB = f"{A}:im", f"{B}:public"


@pytest.fixture
def run(store: ConversationStore) -> Any:
    return store.run


def _add(redis: redis_py.Redis, **fields: str) -> str:
    return str(redis.xadd(SERVICE.inbound, fields).decode())  # type: ignore[union-attr]


def test_keys_share_the_inbound_slot() -> None:
    assert SERVICE.inbound == "gm:inbound" and SERVICE.ready == "{gm:inbound}:ready"
    assert (SERVICE.outbound, SERVICE.dead) == ("gm:outbound", "gm:dead")


def test_ensure_group(run: Any, redis: redis_py.Redis) -> None:
    assert run(SCRIPTS.ensure_group(SERVICE, group="workers")) is True
    assert run(SCRIPTS.ensure_group(SERVICE, group="workers")) is False
    assert redis.exists(SERVICE.inbound)


def test_take_files_entries_per_key_in_arrival_order(run: Any, redis: redis_py.Redis) -> None:
    run(SCRIPTS.ensure_group(SERVICE, group="g"))
    ids = [
        _add(redis, avatar_uuid=A.upper(), channel="im", text="1"),
        _add(redis, avatar_uuid=B, channel="public", text="2"),
        _add(redis, avatar_uuid=A, channel="im", text="3"),
        _add(redis, avatar_uuid="nope", channel="im", text="4"),
        _add(redis, avatar_uuid=A, channel="group", text="5"),
        _add(redis, channel="im", text="6"),
    ]
    first = run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c1", count=2))
    second = run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c2", count=10))
    assert [(t.entry_id, t.member, t.reason) for t in first + second] == [
        (ids[0], MA, ""), (ids[1], MB, ""), (ids[2], MA, ""),
        (ids[3], "", "bad_uuid"), (ids[4], "", "bad_channel"), (ids[5], "", "missing_field"),
    ]  # fmt: skip
    assert [x.decode() for x in redis.lrange("{gm:inbound}:mbox:" + MA, 0, -1)] == [ids[0], ids[2]]
    assert {x.decode() for x in redis.smembers(SERVICE.ready)} == {MA, MB}
    assert run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c1", count=10)) == []


def test_take_without_group(run: Any, redis: redis_py.Redis) -> None:
    from worker.errors import NoConsumerGroup

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


def test_claim_finish_walk_a_mailbox(run: Any, redis: redis_py.Redis) -> None:
    ids = _filed(run, redis, 3)
    claim = SCRIPTS.claim_key(SERVICE, member=MA, owner="w1", lease_ms=10_000)
    step = run(claim)
    assert (step.state, step.entry_id) == ("ok", ids[0])
    assert run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w2", lease_ms=10_000)).state == "busy"
    assert run(claim).entry_id == ids[0]  # the owner may claim again: same head

    def finish(entry: str, owner: str = "w1", release: bool = False) -> Any:
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

    assert (finish(ids[0]).state, finish(ids[0]).entry_id) == ("ok", ids[1])
    assert redis.xlen(SERVICE.inbound) == 2  # acknowledged and deleted: no raw words left
    assert finish(ids[1], release=True).state == "released"
    assert run(SCRIPTS.orphaned_keys(SERVICE, sample=10)) == [MA]
    assert (
        run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w2", lease_ms=10_000)).entry_id == ids[2]
    )
    assert finish(ids[2], owner="w1").state == "lost"  # w2 owns it now
    assert run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w2", lease_ms=10_000)).state == "empty"
    assert not redis.exists("{gm:inbound}:owner:" + MA) and not redis.sismember(SERVICE.ready, MA)
    assert redis.xpending(SERVICE.inbound, "g")["pending"] == 0


def test_finish_empty_and_done(run: Any, redis: redis_py.Redis) -> None:
    [only] = _filed(run, redis, 1)
    run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=10_000))
    step = run(
        SCRIPTS.finish_entry(
            SERVICE, group="g", entry_id=only, member=MA, owner="w", lease_ms=1, release=False
        )
    )
    assert step.state == "empty" and not redis.exists("{gm:inbound}:owner:" + MA)
    bad = _add(redis, avatar_uuid="x", channel="im", text="t")
    run(SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=1))
    done = run(
        SCRIPTS.finish_entry(
            SERVICE, group="g", entry_id=bad, member="", owner="w", lease_ms=1, release=False
        )
    )
    assert done.state == "done" and redis.xlen(SERVICE.inbound) == 0


def test_renew_lease(run: Any, redis: redis_py.Redis) -> None:
    _filed(run, redis, 1)
    run(SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=1000))
    assert run(SCRIPTS.renew_lease(SERVICE, member=MA, owner="w", lease_ms=90_000)) is True
    assert redis.pttl("{gm:inbound}:owner:" + MA) > 60_000
    assert run(SCRIPTS.renew_lease(SERVICE, member=MA, owner="other", lease_ms=90_000)) is False


def test_read_inbound_dead_letter_publish(run: Any, redis: redis_py.Redis) -> None:
    entry = _add(redis, avatar_uuid=A, channel="im", text="héllo")
    assert run(SCRIPTS.read_inbound(SERVICE, entry_id=entry)) == {
        "avatar_uuid": A,
        "channel": "im",
        "text": "héllo",
    }
    assert run(SCRIPTS.read_inbound(SERVICE, entry_id="1-1")) == {}
    for _ in range(4):
        run(SCRIPTS.dead_letter(SERVICE, entry_id=entry, reason="oversized", max_entries=3))
    assert redis.xlen(SERVICE.dead) == 3
    [(_, fields)] = redis.xrange(SERVICE.dead, count=1)
    assert fields == {b"id": entry.encode(), b"reason": b"oversized"}
    run(
        SCRIPTS.publish_reply(
            SERVICE,
            avatar_uuid=A,
            channel="im",
            text_="hi",
            in_reply_to=entry,
            session_id="ab" * 16,
            max_entries=100,
        )
    )
    [(_, out)] = redis.xrange(SERVICE.outbound)
    assert out == {
        b"avatar_uuid": A.encode(),
        b"channel": b"im",
        b"text": b"hi",
        b"in_reply_to": entry.encode(),
        b"session_id": b"ab" * 16,
    }


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (SCRIPTS.ensure_group(SERVICE, group="bad group"), "group"),
        (SCRIPTS.take_inbound(SERVICE, group="g", consumer="c", count=0), "count"),
        (SCRIPTS.take_inbound(SERVICE, group="g", consumer="", count=1), "consumer"),
        (SCRIPTS.claim_key(SERVICE, member="x", owner="w", lease_ms=1), "member"),
        (SCRIPTS.claim_key(SERVICE, member=MA, owner="w", lease_ms=0), "lease_ms"),
        (
            SCRIPTS.finish_entry(
                SERVICE, group="g", entry_id="abc", member=MA, owner="w", lease_ms=1, release=False
            ),
            "entry_id",
        ),
        (SCRIPTS.renew_lease(SERVICE, member=MA, owner="w w", lease_ms=1), "owner"),
        (SCRIPTS.orphaned_keys(SERVICE, sample=0), "sample"),
        (SCRIPTS.read_inbound(SERVICE, entry_id="x"), "entry_id"),
        (SCRIPTS.dead_letter(SERVICE, entry_id="1-0", reason="because", max_entries=1), "reason"),
        (
            SCRIPTS.publish_reply(
                SERVICE,
                avatar_uuid=A.upper(),
                channel="im",
                text_="t",
                in_reply_to="1-0",
                session_id="ab" * 16,
                max_entries=1,
            ),
            "avatar_uuid",
        ),
        (
            SCRIPTS.publish_reply(
                SERVICE,
                avatar_uuid=A,
                channel="group",
                text_="t",
                in_reply_to="1-0",
                session_id="ab" * 16,
                max_entries=1,
            ),
            "channel",
        ),
    ],
)
def test_bad_arguments(run: Any, redis: redis_py.Redis, call: Any, field: str) -> None:
    with pytest.raises(BadScriptArgument, match=f"GM_BADARG {field}"):
        run(call)
    assert redis.dbsize() == 0


def test_read_receipt(store: ConversationStore) -> None:
    from worker import AvatarMessage

    first = store.record(A, "im", AvatarMessage(text="x"), idempotency_key="1-0")
    assert store.receipt(A, "im", "1-0") == first
    assert store.receipt(A, "im", "2-0") is None
    assert store.receipt(B, "im", "1-0") is None
