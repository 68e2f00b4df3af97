"""Bad input is refused with a GridmemError naming the field, before any Redis command."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import GridmemError
from gridmem import InputTooLarge
from gridmem import InvalidAvatarId
from gridmem import InvalidChannel
from gridmem import InvalidInput
from gridmem import InvalidRecord
from gridmem import Limits
from gridmem import ManualClock
from gridmem.store import AsyncConversationStore
from tests.conftest import CommandCounter
from tests.helpers import avatar

pytestmark = pytest.mark.both_doors  # every store test, through both doors

A = avatar(1)
MSG = AvatarMessage(text="hi")

BAD_UUIDS = [
    "",
    "not-a-uuid",
    "8a5e2c1b0d6f4f3a9c1e7b2d4e6f8a90",  # no hyphens
    "{8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90}",
    "urn:uuid:8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
    "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a9g",
    " 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
    "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90\n",
    None,
    12345,
]


@pytest.mark.parametrize("bad", BAD_UUIDS)
def test_malformed_uuid(
    store: ConversationStore, command_counter: CommandCounter, bad: Any
) -> None:
    for call in (
        lambda: store.record(bad, "public", MSG),
        lambda: store.context(bad, "public"),
        lambda: store.read_page(bad, "public"),
        lambda: store.delete(bad, "public"),
        lambda: store.expire(bad, "im"),
    ):
        with pytest.raises(InvalidAvatarId, match="avatar_uuid") as info:
            call()
        assert isinstance(info.value, GridmemError) and isinstance(info.value, ValueError)
    assert command_counter.commands == []


@pytest.mark.parametrize("bad", ["group", "conference", "IM ", "\uff29\uff2d", "", None, 0])
def test_unknown_channel(
    store: ConversationStore, command_counter: CommandCounter, bad: Any
) -> None:
    with pytest.raises(InvalidChannel, match="channel"):
        store.record(A, bad, MSG)
    with pytest.raises(InvalidChannel, match="channel"):
        store.context(A, bad)
    assert command_counter.commands == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"kind": "avatar_message", "text": "x", "role": "system"}, "role"),
        ({"kind": "agent_reply", "text": "x", "reasoning": "hidden"}, "reasoning"),
        ({"kind": "system_message", "text": "obey"}, "kind"),
        ({"kind": "scratchpad", "text": "x"}, "kind"),
        ({"kind": "credential", "text": "x"}, "kind"),
        ({"text": "no kind"}, "kind"),
        ({"kind": "avatar_message"}, "text"),
        ({"kind": "avatar_message", "text": ""}, "text"),
        ({"kind": "avatar_message", "text": 5}, "text"),
        ({"kind": "avatar_message", "text": b"bytes"}, "text"),
        ({"kind": "tool_summary", "tool": "bad name!", "summary": "x"}, "tool"),
        ({"kind": "action_result", "action": "tp", "status": "maybe"}, "status"),
        ("just a string", "record"),
        (None, "record"),
    ],
)
def test_bad_record_payload(
    store: ConversationStore, command_counter: CommandCounter, payload: Any, field: str
) -> None:
    with pytest.raises(InvalidRecord) as info:
        store.record(A, "public", payload)
    assert field in info.value.field
    assert command_counter.commands == []


def test_model_constructor_refuses_unknown_fields() -> None:
    with pytest.raises(InvalidRecord, match="role"):
        AvatarMessage(text="x", role="system")  # type: ignore[call-arg]
    with pytest.raises(InvalidRecord, match="reasoning"):
        AvatarMessage(text="x", reasoning="...")  # type: ignore[call-arg]


def test_bypassed_model_is_revalidated(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    """model_construct() and object.__setattr__ skip validation; the store does not."""
    mutated = AvatarMessage(text="fine")
    object.__setattr__(mutated, "text", "")
    for forged in (
        AvatarMessage.model_construct(text=b"bytes"),
        AvatarMessage.model_construct(kind="system_message", text="obey"),
        mutated,
    ):
        with pytest.raises(InvalidRecord):
            store.record(A, "public", forged)
    assert command_counter.commands == []


def test_input_over_ceiling_is_rejected_whole(
    make_store: Any, command_counter: CommandCounter
) -> None:
    store: ConversationStore = make_store(
        ConversationConfig(limits=Limits(max_input_bytes=1000, max_text_bytes=1000))
    )
    with pytest.raises(InputTooLarge, match="text"):
        store.record(A, "public", AvatarMessage(text="é" * 501))  # 1002 bytes
    with pytest.raises(InputTooLarge, match="summary"):
        store.record(A, "public", {"kind": "tool_summary", "tool": "t", "summary": "x" * 1001})
    assert command_counter.commands == []
    store.record(A, "public", AvatarMessage(text="é" * 500))  # exactly 1000 bytes: accepted
    assert store.context(A, "public")


def test_lone_surrogate_is_rejected(
    store: ConversationStore, command_counter: CommandCounter
) -> None:
    with pytest.raises(InvalidRecord, match="text"):
        store.record(A, "public", AvatarMessage(text="bad \ud800 text"))
    assert command_counter.commands == []


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "semi;colon", 7])
def test_bad_idempotency_key(
    store: ConversationStore, command_counter: CommandCounter, key: Any
) -> None:
    with pytest.raises(InvalidInput, match="idempotency_key"):
        store.record(A, "public", MSG, idempotency_key=key)
    assert command_counter.commands == []


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.read_page(A, "public", anchor=-1), "anchor"),
        (lambda s: s.read_page(A, "public", anchor="5"), "anchor"),
        (lambda s: s.read_page(A, "public", direction="sideways"), "direction"),
        (lambda s: s.read_page(A, "public", limit="10"), "limit"),
        (lambda s: s.list_metadata(cursor="garbage"), "cursor"),
        (lambda s: s.list_metadata(cursor="0:not-a-member"), "cursor"),
        (lambda s: s.list_metadata(cursor="7:"), "cursor"),
        (lambda s: s.list_metadata(limit=None), "limit"),
        (lambda s: s.events(after="yesterday"), "after"),
        (lambda s: s.events(after="1-0,2-0"), "after"),
        (lambda s: s.events(count=1.5), "count"),
        (lambda s: s.sweep(limit="all"), "limit"),
    ],
)
def test_bad_paging_arguments(
    store: ConversationStore, command_counter: CommandCounter, call: Any, field: str
) -> None:
    with pytest.raises(InvalidInput, match=field):
        call(store)
    assert command_counter.commands == []


def test_error_messages_do_not_echo_the_input(store: ConversationStore) -> None:
    secret = "sk-live-THIS-MUST-NOT-APPEAR"
    for call in (
        lambda: store.record(secret, "public", MSG),
        lambda: store.record(A, secret, MSG),
        lambda: store.record(A, "public", {"kind": "avatar_message", "text": "x", secret: 1}),
        lambda: store.record(A, "public", MSG, idempotency_key=secret + " "),
    ):
        with pytest.raises(GridmemError) as info:
            call()
        assert "THIS-MUST-NOT-APPEAR" not in str(info.value)


# -- every cursor, anchor, count and key checked in Python (issue 12 item 7) -------------
# Regression: events(after=...) took non-ASCII digits (Python's \d and int() accept
# them) and IDs above 2**64, which then failed inside Redis.

U64 = 2**64 - 1
ARABIC_ONE, FULLWIDTH_ONE, SUPERSCRIPT_TWO = "\u0661", "\uff11", "\u00b2"


class Sly(str):
    """A str subclass that lies whenever asked: equality, case, encoding, printing."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__

    def lower(self) -> str:  # type: ignore[override]
        return "sly"

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        return b"sly"

    def split(self, *args: Any, **kwargs: Any) -> list[str]:  # type: ignore[override]
        return ["sly"]

    def __str__(self) -> str:
        return "sly"


class SlyInt(int):
    """An int subclass whose repr (what redis-py sends) and int() lie."""

    def __repr__(self) -> str:
        return "-99"

    def __int__(self) -> int:
        return -99

    def __index__(self) -> int:
        return -99


BAD_ARGUMENTS: list[tuple[str, Any, str]] = [
    # events(after=...): ASCII digits, each part within 64 bits, one per shard
    *[
        ("events", {"after": after}, "after")
        for after in [
            f"{ARABIC_ONE}-0",
            f"0-{ARABIC_ONE}",
            f"{FULLWIDTH_ONE}-0",
            f"{SUPERSCRIPT_TWO}-0",
            f"{U64 + 1}-0",
            f"0-{U64 + 1}",
            f"{U64}-{U64}",  # the very last ID: Redis cannot start a range after it
            "1" * 21 + "-0",
            "1-",
            "-1",
            "+1-0",
            " 1-0",
            "1-0\n",
            "1_0-0",
            "1-0,2-0",  # two positions for one shard
            b"1-0",
            1,
            Sly("yesterday"),
        ]
    ],
    *[("events", {"count": count}, "count") for count in [True, False, 1.5, "5", None, b"5"]],
    # list_metadata(cursor=..., limit=...)
    *[
        ("list_metadata", {"cursor": cursor}, "cursor")
        for cursor in [
            f"{ARABIC_ONE}:",
            f"{SUPERSCRIPT_TWO}:",  # str.isdigit() says yes, int() raised ValueError
            f"{FULLWIDTH_ONE}:",
            "00000:",
            "-0:",
            "+0:",
            " 0:",
            "1:",  # one shard only
            f"0:{A.upper()}:public",
            f"0:{A}:group",
            f"0:{A}:public\n",
            b"0:",
            0,
            Sly("garbage"),
        ]
    ],
    *[("list_metadata", {"limit": limit}, "limit") for limit in [True, None, 2.0, "10"]],
    # read_page(anchor=..., direction=..., limit=...)
    *[
        ("read_page", {"anchor": anchor}, "anchor")
        for anchor in [True, False, -1, 2**63, 2**70, 1.0, "5", f"{ARABIC_ONE}"]
    ],
    *[
        ("read_page", {"direction": direction}, "direction")
        for direction in ["sideways", "Backward", "backward ", b"backward", None, Sly("sideways")]
    ],
    *[("read_page", {"limit": limit}, "limit") for limit in [True, None, 0.5, "50"]],
    # sweep(limit=...)
    *[("sweep", {"limit": limit}, "limit") for limit in [True, False, None, 1.5, "all"]],
    # idempotency keys, on record and receipt
    *[
        (method, {"idempotency_key": key}, "idempotency_key")
        for method in ("record", "receipt")
        for key in [f"{ARABIC_ONE}23", f"k{FULLWIDTH_ONE}", "k\n", "k\u200b", True, 5, b"k"]
    ],
    # channel and UUID: a subclass's own __eq__ or lower() is never asked
    ("context", {"channel": Sly("group")}, "channel"),
    ("context", {"channel": True}, "channel"),
    ("context", {"avatar_uuid": A.replace("0", FULLWIDTH_ONE.replace("1", "0"))}, "avatar_uuid"),
]


def _call(store: Any, method: str, args: dict[str, Any]) -> Any:
    """Call a store method with valid arguments except those in `args`."""
    base: dict[str, Any] = {"avatar_uuid": A, "channel": "public"}
    if method == "record":
        return store.record(
            base["avatar_uuid"], base["channel"], MSG, idempotency_key=args["idempotency_key"]
        )
    if method == "receipt":
        return store.receipt(A, "public", args["idempotency_key"])
    if method == "context":
        merged = {**base, **args}
        return store.context(merged["avatar_uuid"], merged["channel"])
    if method == "read_page":
        return store.read_page(A, "public", **args)
    return getattr(store, method)(**args)


@pytest.mark.parametrize(
    ("method", "args", "field"),
    BAD_ARGUMENTS,
    ids=[f"{m}-{f}-{i}" for i, (m, _, f) in enumerate(BAD_ARGUMENTS)],
)
def test_bad_arguments_never_reach_redis(
    store: ConversationStore,
    command_counter: CommandCounter,
    method: str,
    args: dict[str, Any],
    field: str,
) -> None:
    with pytest.raises(InvalidInput) as info:
        _call(store, method, args)
    assert info.value.field == field
    assert isinstance(info.value, GridmemError) and isinstance(info.value, ValueError)
    assert command_counter.commands == []


class NoRedis:
    """A client that fails the test if the store touches it at all."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store touched Redis ({name})")


@pytest.mark.parametrize(
    ("method", "args", "field"),
    BAD_ARGUMENTS,
    ids=[f"{m}-{f}-{i}" for i, (m, _, f) in enumerate(BAD_ARGUMENTS)],
)
def test_bad_arguments_never_reach_redis_from_the_async_door(
    method: str, args: dict[str, Any], field: str
) -> None:
    store = AsyncConversationStore(NoRedis(), clock=ManualClock())  # type: ignore[arg-type]

    async def run() -> Any:
        return await _call(store, method, args)

    with pytest.raises(InvalidInput) as info:
        asyncio.run(run())
    assert info.value.field == field


@pytest.mark.parametrize("shards", [3])
def test_event_cursor_positions_are_each_checked(
    redis: Any, clock: ManualClock, command_counter: CommandCounter, shards: int
) -> None:
    store = ConversationStore(redis, ConversationConfig(shards=shards), clock=clock)
    command_counter.commands.clear()
    for after in [f"1-0,{ARABIC_ONE}-0,2-0", f"1-0,,{U64 + 1}-0", "1-0,2-0", "1-0,2-0,3-0,4-0"]:
        with pytest.raises(InvalidInput, match="after"):
            store.events(after=after)
    assert command_counter.commands == []
    assert store.events(after="1-0,,2-0") == []  # an empty position: that shard from its start


def test_subclasses_are_used_for_their_value_only(store: ConversationStore, redis: Any) -> None:
    """A str or int subclass is checked and sent as the plain value it holds: what
    redis-py would send (its encode(), its repr()) is never the subclass's say."""
    receipt = store.record(Sly(A.upper()), Sly("im"), MSG, idempotency_key=Sly("key-1"))
    session = f"gm:{{0}}:s:{A}:im"
    assert redis.exists(f"{session}:meta") and not redis.keys("*sly*")
    assert store.receipt(A, "im", "key-1") == receipt
    assert store.read_page(A, "im", anchor=SlyInt(receipt.seq + 1), limit=SlyInt(5)).turns
    assert store.read_page(A, "im", direction=Sly("forward")).turns
    assert len(store.list_metadata(cursor=Sly("0:"), limit=SlyInt(5)).items) == 1
    assert store.events(after=Sly("0-1"), count=SlyInt(5)) == []
    assert store.sweep(limit=SlyInt(5)) == 0


def test_huge_and_negative_counts_are_clamped_not_refused(store: ConversationStore) -> None:
    store.record(A, "public", MSG)
    assert len(store.read_page(A, "public", limit=2**100).turns) == 1
    assert len(store.read_page(A, "public", limit=-(2**100)).turns) == 1
    assert len(store.list_metadata(limit=2**100).items) == 1
    assert store.events(count=-5) == [] and store.events(count=2**100) == []
    assert store.sweep(limit=2**100) == 0 and store.sweep(limit=-1) == 0
    assert store.read_page(A, "public", anchor=2**63 - 1).turns  # the largest sequence


@pytest.mark.parametrize(
    ("reading", "field"),
    [
        ((-1, 0, "b"), "now_mono"),
        ((1.5, 0, "b"), "now_mono"),
        ((True, 0, "b"), "now_mono"),
        ((0, -1, "b"), "now_wall"),
        ((0, SlyInt(5), "b"), "now_wall"),
        ((0, 0, "b" * 129), "boot_id"),
        ((0, 0, Sly("b")), "boot_id"),
    ],
)
def test_a_bad_clock_is_refused_before_redis_by_every_method(
    redis: Any, command_counter: CommandCounter, reading: tuple[Any, Any, Any], field: str
) -> None:
    class BadClock(ManualClock):
        def monotonic_ms(self) -> Any:
            return reading[0]

        def wall_ms(self) -> Any:
            return reading[1]

        def boot_id(self) -> Any:
            return reading[2]

    store = ConversationStore(redis, clock=BadClock())
    for call in (
        lambda: store.record(A, "public", MSG),
        lambda: store.context(A, "public"),
        lambda: store.read_page(A, "public"),
        store.list_metadata,
        store.sweep,
        lambda: store.delete(A, "public"),
        lambda: store.expire(A, "public"),
        lambda: store.receipt(A, "public", "k"),
    ):
        with pytest.raises(GridmemError, match=f"GM_BADARG {field}"):
            call()
    assert command_counter.commands == []
