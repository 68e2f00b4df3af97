"""Whatever the write path stores, flush() then restore() into an empty server gives it back.

Issue 12 item 1: restore re-ran redaction over stored text and called any match a
secret, so the write path's own output (redacted URLs and headers, "" for a
message of control characters, a long token cut into the shape of a key, summary
lines cut inside their head by a small max_summary_bytes) quarantined whole
generations and the store restarted empty. The property here runs the write
path over the redaction tests' own generators, text at and over every byte
limit, small and large limits, enough turns to compact, and checks the round
trip. Every counterexample ever found is an @example.
"""

from __future__ import annotations

import shutil
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import InputTooLarge
from gridmem import InvalidRecord
from gridmem import Limits
from gridmem import ManualClock
from gridmem.codec import decode_entries
from gridmem.config import MIN_TEXT_BYTES
from gridmem.config import SUMMARY_LINE_BYTES
from gridmem.prepare import AGENT_HEAD
from gridmem.prepare import AVATAR_HEAD
from gridmem.prepare import action_head
from gridmem.prepare import fold_line
from gridmem.prepare import tool_head
from gridmem.records import ToolSummary
from tests.conftest import short_tempdir
from tests.helpers import avatar
from tests.test_redaction import ANY_SECRET
from tests.test_redaction import SECRETS
from tests.test_redaction import chat_with_secrets

WHO = [avatar(1), avatar(2)]
# Control characters as the write path's contract names them (C0 but tab and newline,
# DEL, C1): the test's own list, not the code's pattern.
CONTROL = "".join(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in "\t\n")
TOOLS = ["map", "web.fetch", "t" * 64, "x:y-z.1"]
ACTIONS = ["give", "teleport", "a" * 64]


@dataclass(frozen=True)
class Op:
    """One record() call and what the test expects of it."""

    who: int
    channel: str
    kind: str  # avatar | agent | tool | action
    text: str
    name: str = ""
    status: str = "ok"

    def record(self) -> Any:
        match self.kind:
            case "avatar":
                return AvatarMessage(text=self.text)
            case "agent":
                return AgentReply(text=self.text)
            case "tool":
                return ToolSummary(tool=self.name, summary=self.text)
            case _:
                return ActionResult(action=self.name, status=self.status, detail=self.text)

    def refusal(self, limits: Limits) -> type[Exception] | None:
        """What record() must raise, from the contract: over the input ceiling, or
        nothing but control characters in a field the model requires."""
        if len(self.text.encode("utf-8")) > limits.max_input_bytes:
            return InputTooLarge
        if self.kind != "action" and all(c in CONTROL for c in self.text):
            return InvalidRecord
        return None


def roundtrip(client: Any, snapdir: Path, config: ConversationConfig, ops: list[Op]) -> None:
    """Record `ops`, flush, empty the server, restore: same contexts, nothing quarantined."""
    clock = ManualClock()
    store = ConversationStore(client, config, clock=clock, snapshot_dir=snapdir)
    keys = set()
    for op in ops:
        refusal = op.refusal(config.limits)
        if refusal is not None:
            with pytest.raises(refusal):
                store.record(WHO[op.who], op.channel, op.record())
            continue
        store.record(WHO[op.who], op.channel, op.record())
        keys.add((WHO[op.who], op.channel))
        clock.advance(1_000)

    def everything(s: ConversationStore) -> Any:
        contexts = {key: s.context(*key) for key in sorted(keys)}
        pages = {key: s.read_page(*key, limit=200).turns for key in sorted(keys)}
        return contexts, pages, s.list_metadata(limit=1000).items

    before = everything(store)
    info = store.flush()
    assert info is not None
    client.flushall()  # an empty server
    fresh = ConversationStore(client, config, clock=clock, snapshot_dir=snapdir)
    report = fresh.restore()
    assert report.error is None
    assert report.quarantined == [] and report.skipped == [] and report.unreadable == []
    assert report.generation == info.generation
    assert report.sessions_restored == len(before[2]) == info.sessions
    assert everything(fresh) == before


def _sized(unit: str, size: int) -> str:
    """`unit` repeated to at most `size` UTF-8 bytes (whole characters)."""
    text = unit * (size // max(1, len(unit.encode("utf-8"))) + 1)
    return text.encode("utf-8")[:size].decode("utf-8", "ignore")


def _bound(limits: Limits, kind: str) -> int:
    return limits.max_tool_result_bytes if kind == "tool" else limits.max_text_bytes


def fold_head(kind: str, name: str, status: str) -> str:
    return {
        "avatar": AVATAR_HEAD,
        "agent": AGENT_HEAD,
        "tool": tool_head(name),
        "action": action_head(name, status),
    }[kind]


@st.composite
def _cut_shaped(draw: st.DrawFn, bound: int, head: str) -> str:
    """A key-like run that a cut (the text bound, or the summary line's) ends inside.

    `AKIA` + 16 characters is an AWS key; with more characters it is not, until a
    cut leaves exactly 16 before the marker. Likewise a token whose cut tail
    reaches a rule's minimum length.
    """
    prefix = draw(st.sampled_from(["AKIA", "ASIA", "ghp_", "sk-proj-", "glpat-", "xoxb-"]))
    body_len = {"AKIA": 16, "ASIA": 16, "ghp_": 36, "sk-proj-": 20, "glpat-": 20, "xoxb-": 10}
    alphabet = string.ascii_uppercase + string.digits if prefix[0] == "A" else string.ascii_letters
    run = prefix + draw(st.text(alphabet, min_size=body_len[prefix] + 1, max_size=60))
    # where the cut lands: the text bound's, or the summary line's (" [...]" after it)
    room = SUMMARY_LINE_BYTES - len(head.encode("utf-8")) - len(" [...]")
    cut = draw(st.sampled_from([bound - len(" [truncated]"), room]))
    pad = max(0, cut - len(prefix) - body_len[prefix] - 1 + draw(st.integers(-2, 2)))
    return "x" * pad + " " + run + " " + draw(st.sampled_from(["tail", "", "and more words"]))


def texts_near_bounds(limits: Limits, kind: str, head: str) -> st.SearchStrategy[str]:
    bound = _bound(limits, kind)
    near = st.integers(max(0, bound - 16), bound + 16)
    ceiling = limits.max_input_bytes
    return st.one_of(
        chat_with_secrets().map(lambda c: c[0]),
        ANY_SECRET.map(lambda s: s[0]),
        st.text(max_size=120),
        st.text(st.sampled_from(CONTROL), min_size=1, max_size=6),
        st.tuples(chat_with_secrets(), st.text(st.sampled_from(CONTROL), max_size=4)).map(
            lambda p: p[1] + p[0][0] + p[1]
        ),
        # at and around the byte bound, in characters of 1 to 4 bytes
        st.tuples(st.sampled_from(["a", "é", "€", "🙂", "word ", "Q7"]), near).map(
            lambda p: _sized(*p)
        ),
        # over the bound with a secret across the cut
        st.tuples(ANY_SECRET, near).map(lambda p: _sized("y ", p[1] - 10) + " " + p[0][0]),
        _cut_shaped(bound, head),
        # a newline between a name and its value: the summary flattens it to one line
        st.tuples(
            st.sampled_from(["password", "token", "api_key", "Authorization:", "secret"]),
            st.sampled_from(["\n= ", "\n=", ":\n", "\n: ", "\n"]),
            st.text(string.ascii_letters + string.digits, min_size=8, max_size=30),
        ).map("".join),
        st.sampled_from([_sized("z", ceiling + 1), _sized("é", ceiling)]),
    )


@st.composite
def _op(draw: st.DrawFn, limits: Limits) -> Op:
    kind = draw(st.sampled_from(["avatar", "agent", "tool", "action"]))
    name = draw(st.sampled_from(TOOLS if kind == "tool" else ACTIONS))
    status = draw(st.sampled_from(["ok", "failed", "denied"]))
    text = draw(texts_near_bounds(limits, kind, fold_head(kind, name, status)))
    return Op(
        draw(st.integers(0, 1)), draw(st.sampled_from(["public", "im"])), kind, text, name, status
    )


@st.composite
def _limits(draw: st.DrawFn) -> Limits:
    text = draw(st.sampled_from([MIN_TEXT_BYTES, 33, 40, 64, 100, 500, 8192]))
    tool = draw(st.sampled_from([MIN_TEXT_BYTES, 50, 300, 4096]))
    summary = draw(st.sampled_from([SUMMARY_LINE_BYTES, SUMMARY_LINE_BYTES + 1, 300, 700, 8192]))
    need = summary + 2 * max(text, tool) + 1024
    return Limits(
        max_text_bytes=text,
        max_tool_result_bytes=tool,
        max_summary_bytes=summary,
        max_session_bytes=draw(st.sampled_from([need, 2 * need, 256 * 1024])),
        max_turns_per_session=draw(st.sampled_from([1, 2, 3, 5, 200])),
        max_tool_results_per_session=draw(st.sampled_from([1, 2, 20])),
        max_input_bytes=draw(st.sampled_from([max(text, 2048), 1 << 20])),
        max_archive_segments=draw(st.sampled_from([1, 3, 20])),
        max_archive_bytes=draw(st.sampled_from([300, 4096, 1 << 20])),
    )


@st.composite
def conversations(draw: st.DrawFn) -> tuple[ConversationConfig, list[Op]]:
    limits = draw(_limits())
    config = ConversationConfig(limits=limits, archive_enabled=draw(st.booleans()))
    return config, draw(st.lists(_op(limits), min_size=1, max_size=24))


def _config(archive: bool = False, **limits: int) -> ConversationConfig:
    return ConversationConfig(limits=Limits(**limits), archive_enabled=archive)


# The examples and every counterexample found since, as (config, ops).
AWS_CUT = "x AKIA" + "QZ7" * 7 + "Q" + " and more words"  # a 26-character run, cut after 20
FOLD_CUT = "x" * 191 + " AKIA" + "Q" * 20 + " end"  # the summary line's cut ends a key
EXAMPLES: dict[str, tuple[ConversationConfig, list[Op]]] = {
    "redacted url keeps its ?token= shape": (
        _config(),
        [Op(0, "im", "avatar", "see https://x.org/a?token=Zq8xW2rT9vB4nM1k ok")],
    ),
    "redacted userinfo": (_config(), [Op(0, "im", "avatar", "ftp://alice:Sup3rSecret@files.example.org/")]),
    "redacted credential header": (
        _config(),
        [Op(0, "im", "agent", 'curl -H "X-Api-Key: Zq8xW2rT9vB4nM1kLp0" https://api.example.org')],
    ),
    "only control characters": (
        _config(),
        [
            Op(0, "im", "avatar", "\x01\x02\x7f"),
            Op(0, "im", "agent", "\x85"),
            Op(0, "im", "tool", "\x1b", "map"),
            Op(0, "im", "action", "\x07\x08", "give"),
            Op(0, "im", "avatar", "still here"),
        ],
    ),
    "a cut leaves the shape of an aws key": (
        _config(max_text_bytes=2 + 20 + len(" [truncated]")),
        [Op(0, "public", "avatar", AWS_CUT)],
    ),
    "the summary line's cut leaves the shape of an aws key": (
        _config(max_turns_per_session=1),
        [Op(0, "public", "avatar", FOLD_CUT), Op(0, "public", "agent", "ok")],
    ),
    "a newline between a name and its value, flattened by the summary": (
        _config(max_turns_per_session=1),
        [Op(1, "im", "avatar", "password\n= hunter22xyz"), Op(1, "im", "avatar", "token\n=Zq8xW2rT9")],
    ),
    "smallest summary bound, longest heads": (
        _config(archive=True, max_summary_bytes=SUMMARY_LINE_BYTES, max_turns_per_session=2),
        [
            *[Op(0, "im", "tool", f"{i} " + "€" * 200, "t" * 64) for i in range(6)],
            *[Op(0, "im", "action", f"{i} " + "é" * 200, "a" * 64, "failed") for i in range(6)],
        ],
    ),
    "smallest text bounds": (
        _config(max_text_bytes=MIN_TEXT_BYTES, max_tool_result_bytes=MIN_TEXT_BYTES, max_turns_per_session=3),
        [Op(i % 2, "public", kind, "🙂" * 40 + " sk-proj-Zq8xW2rT9vB4nM1kLp0a", "map") for i, kind in
         enumerate(["avatar", "agent", "tool", "action", "avatar", "tool"])],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_round_trip_on_every_backend(redis: Any, name: str) -> None:
    """The issue's examples, each of which used to quarantine its whole generation."""
    config, ops = EXAMPLES[name]
    snapdir = short_tempdir("gm-rt-")
    try:
        roundtrip(redis, snapdir, config, ops)
    finally:
        shutil.rmtree(snapdir, ignore_errors=True)


def _example(name: str) -> Callable[[Any], Any]:
    return example(EXAMPLES[name])


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(conversations())
@_example("redacted url keeps its ?token= shape")
@_example("a cut leaves the shape of an aws key")
@_example("the summary line's cut leaves the shape of an aws key")
@_example("a newline between a name and its value, flattened by the summary")
def test_whatever_the_write_path_stores_restores_unchanged(
    case: tuple[ConversationConfig, list[Op]],
) -> None:
    config, ops = case
    snapdir = short_tempdir("gm-rt-")
    try:
        roundtrip(fakeredis.FakeRedis(server=fakeredis.FakeServer()), snapdir, config, ops)
    finally:
        shutil.rmtree(snapdir, ignore_errors=True)


def test_every_secret_family_is_in_the_generators() -> None:
    """The property draws from the redaction tests' families: a new family reaches it too."""
    assert len(SECRETS) >= 20


# -- the summary line Lua folds, as the write path checks it --------------------------------


@pytest.mark.parametrize("archive", [False, True])
def test_python_fold_line_is_what_lua_folds(redis: Any, archive: bool) -> None:
    """gridmem/prepare.py fold_line() must be lua/lib.lua summary_line(), byte for byte:
    the write path checks the line the summary will hold before storing a record."""
    config = _config(archive=archive, max_turns_per_session=1, max_summary_bytes=64 * 1024)
    store = ConversationStore(redis, config, clock=ManualClock())
    who = avatar(9)
    turns = f"gm:{{0}}:s:{who}:im:turns"
    texts = [
        ("avatar", "", "", "short"),
        ("agent", "", "", "two\nlines\r\n\nand more"),
        ("tool", "t" * 64, "", "€" * 100),  # a cut inside a 3-byte character
        ("action", "give", "denied", ""),
        ("action", "a" * 64, "failed", "🙂" * 60),
        ("avatar", "", "", "x" * 217),  # exactly the room after the head, and one over
        ("avatar", "", "", "x" * 218),
        ("avatar", "", "", "x" * 219),
        ("tool", "map", "", "line\n" * 80),
    ]
    stored = []
    for kind, name, status, text in texts:
        op = Op(0, "im", kind, text, name, status or "ok")
        store.record(who, "im", op.record())
        [entry] = decode_entries([e.decode() for e in redis.zrange(turns, -1, -1)])
        text_as_stored = entry.fields[-1]  # the free-text field
        head = fold_head(kind, name, status or "ok")
        stored.append(fold_line(head, text_as_stored, SUMMARY_LINE_BYTES)[0])
    store.record(who, "im", AvatarMessage(text="pushes the last one out"))
    summary = redis.get(f"gm:{{0}}:s:{who}:im:summary").decode("utf-8")
    assert summary.split("\n") == stored
    # and by hand, for two of them (expected values from the test, not the code)
    assert stored[0] == "- avatar (untrusted): short"
    assert stored[1] == "- agent: two lines and more"
    assert stored[7] == "- avatar (untrusted): " + "x" * 212 + " [...]"


# -- limits that would make unrestorable data are refused ---------------------------------------


@pytest.mark.parametrize(
    ("field", "smallest"),
    [
        ("max_summary_bytes", SUMMARY_LINE_BYTES),
        ("max_text_bytes", MIN_TEXT_BYTES),
        ("max_tool_result_bytes", MIN_TEXT_BYTES),
    ],
)
def test_limits_below_a_restorable_floor_are_refused(field: str, smallest: int) -> None:
    """A summary bound under one folded line cut lines inside their head (bad_summary on
    restore); a text bound under the " [truncated]" marker stored texts over it."""
    assert SUMMARY_LINE_BYTES == 240  # the longest head is 85 bytes: every line keeps its head
    Limits(**{field: smallest})
    with pytest.raises(
        ValidationError, match=rf"{field} = {smallest - 1} must be at least {smallest}"
    ):
        Limits(**{field: smallest - 1})


def test_clock_stepping_back_between_turns_still_restores(redis: Any) -> None:
    """A turn stamped before its session's creation (wall clock stepped back, or a host
    behind the one that opened the session) made restore refuse the generation."""
    snapdir = short_tempdir("gm-rt-")
    try:
        clock = ManualClock()
        store = ConversationStore(redis, clock=clock, snapshot_dir=snapdir)
        store.record(WHO[0], "im", AvatarMessage(text="from the host ahead"))
        clock.set_wall(clock.wall_ms() - 2_000)
        store.record(WHO[0], "im", AvatarMessage(text="from the host behind"))
        before = store.context(WHO[0], "im")
        store.flush()
        redis.flushall()
        report = store.restore()
        assert report.quarantined == [] and report.sessions_restored == 1
        assert store.context(WHO[0], "im") == before
        [meta] = store.list_metadata().items
        assert meta.created_at_ms <= meta.last_active_at_ms
    finally:
        shutil.rmtree(snapdir, ignore_errors=True)
