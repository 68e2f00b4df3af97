"""One rule for channel names, everywhere: any ASCII case, canonicalised to lowercase.

Regression (issue 13, item 11): the library refused `IM` and the inbound stream
dead-lettered it, while an uppercase UUID was accepted and canonicalised. Now a
channel is read as a UUID is: `IM`, `Im`, `PUBLIC` name the `im` / `public`
session, in the library (every backend), on the inbound stream (take_inbound.lua
and the worker) and in bin/gridmem-cli. No whitespace, nothing but ASCII letters:
a look-alike is refused before Redis is touched.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from gridmem import AvatarMessage
from gridmem import Channel
from gridmem import ConversationStore
from gridmem import InvalidChannel
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import cli_binary
from gridmem.keys import KeySpace
from gridmem.scripts import REJECTED_MEMBER
from gridmem.scripts import Scripts
from gridmem.scripts import load_scripts
from tests.conftest import CommandCounter
from tests.helpers import avatar
from tests.test_operator_cli import CLI
from tests.test_operator_cli import gm
from tests.test_worker import go
from tests.test_worker import new_client
from tests.test_worker import running

__all__ = ["new_client"]  # the fixture, used by the worker test below

A = avatar(1)
SPELLINGS = {Channel.IM: ["im", "IM", "Im", "iM"], Channel.PUBLIC: ["public", "PUBLIC", "Public"]}
REFUSED = [
    "group",
    "GROUP",
    "conference",
    "IM ",  # whitespace is not part of a name (a UUID takes none either)
    " im",
    "im\n",
    "i m",
    "\uff29\uff2d",  # full-width IM
    "\uff49\uff4d",  # full-width im
    "\u0406m",  # Cyrillic capital I, then m
    "\u0456m",  # Cyrillic small i, then m
    "\u0130m",  # dotted capital I: Unicode lowers it to i + a combining dot; bash to i
    "publ\u0130c",
    "PUBL\u0130C",
    "im\u200b",  # a zero-width space after it
    "",
]


@pytest.mark.parametrize("channel", list(SPELLINGS))
def test_any_case_lands_in_the_one_session(store: ConversationStore, channel: Channel) -> None:
    # Given one record per spelling of the channel
    receipts = [
        store.record(A, spelled, AvatarMessage(text=f"said as {spelled}"))
        for spelled in SPELLINGS[channel]
    ]
    # Then they are one session, under the lowercase name, read back by any spelling
    assert len({r.session_id for r in receipts}) == 1 and receipts[0].new_session
    [session] = store.list_metadata().items
    assert session.channel is channel and session.turn_count == len(receipts)
    for spelled in SPELLINGS[channel]:
        said = [m.content for m in store.context(A, spelled)]
        assert said == [f"said as {s}" for s in SPELLINGS[channel]]
    assert [t.text for t in store.read_page(A, SPELLINGS[channel][-1]).turns] == said
    assert store.delete(A, SPELLINGS[channel][1]) is True
    assert store.list_metadata().items == []


@pytest.mark.parametrize("bad", REFUSED)
def test_look_alikes_and_whitespace_are_refused_before_redis(
    store: ConversationStore, command_counter: CommandCounter, bad: str
) -> None:
    for call in (
        lambda: store.record(A, bad, AvatarMessage(text="hi")),
        lambda: store.context(A, bad),
        lambda: store.read_page(A, bad),
        lambda: store.delete(A, bad),
    ):
        with pytest.raises(InvalidChannel, match="channel"):
            call()
    assert command_counter.commands == []


def test_the_enum_reads_names_the_same_way() -> None:
    assert Channel("IM") is Channel.IM and Channel("Public") is Channel.PUBLIC
    for bad in REFUSED:
        with pytest.raises(ValueError):
            Channel(bad)


# -- the inbound stream ----------------------------------------------------------------------


def _add(redis: redis_py.Redis, channel: str) -> str:
    entry: Any = redis.xadd("gm:inbound", {"avatar_uuid": A, "channel": channel, "text": "x"})
    return str(entry.decode())


def test_take_inbound_files_any_case_under_the_lowercase_key(redis: redis_py.Redis) -> None:
    """take_inbound.lua files `IM` under `<uuid>:im`, as the worker reads it; a look-alike
    or a padded name is bad_channel, filed under the reserved key."""
    scripts, service = Scripts(load_scripts()), KeySpace().service()
    store = ConversationStore(redis)
    store.executor.call(scripts.ensure_group(service, group="g"))
    good = {spelled: _add(redis, spelled) for names in SPELLINGS.values() for spelled in names}
    bad = {spelled: _add(redis, spelled) for spelled in REFUSED}
    taken = store.executor.call(scripts.take_inbound(service, group="g", consumer="c", count=100))
    filed = {t.entry_id: (t.member, t.reason) for t in taken}
    for spelled, entry in good.items():
        assert filed[entry] == (f"{A}:{spelled.lower()}", ""), spelled
    for spelled, entry in bad.items():
        assert filed[entry] == (REJECTED_MEMBER, "bad_channel"), spelled


def test_the_worker_answers_any_case_in_the_one_session(
    new_client: Callable[[], Any],
) -> None:
    """End to end on every backend: `IM` and `im` are answered in one session, the
    reply names the lowercase channel; a full-width IM is dead-lettered bad_channel."""

    async def scenario() -> None:
        async with running(new_client) as run:
            upper = await run.send(1, "first, as IM", channel="IM")
            look_alike = await run.send(1, "as a look-alike", channel="\uff29\uff2d")
            lower = await run.send(1, "then as im", channel="im")
            mixed = await run.send(1, "and as Im", channel="Im")
            await run.answered(upper, lower, mixed)
            await run.dead_lettered(look_alike)
            replies = [run.replies[e] for e in (upper, lower, mixed)]
            assert {r["channel"] for r in replies} == {"im"}
            assert len({r["session_id"] for r in replies}) == 1
            assert await run.dead() == {look_alike: {"id": look_alike, "reason": "bad_channel"}}
            page = await run.store.read_page(avatar(1), "im", None, "forward", 50)
            assert [t.text for t in page.turns if t.role == "avatar"] == [
                "first, as IM",
                "then as im",
                "and as Im",
            ]

    go(scenario())


# -- bin/gridmem-cli -----------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("spelled", ["IM", "Im", "iM"])
def test_the_cli_takes_any_case(real_servers: dict[str, EmbeddedValkey], spelled: str) -> None:
    server = real_servers["valkey"]
    server.client().flushall()
    store = ConversationStore(server.client())
    store.record(A, "im", AvatarMessage(text="hello"))
    client = cli_binary()
    shown = gm(server, client, "--json", "transcript", A, spelled, "--show-content")
    assert shown.returncode == 0, shown.stderr
    done = gm(server, client, "--json", "delete", A, spelled)
    assert done.returncode == 0, done.stderr
    assert '"channel": "im"' in done.stdout and '"removed": true' in done.stdout, done.stdout
    assert store.context(A, "im") == []


@pytest.mark.real
@pytest.mark.parametrize("bad", [b for b in REFUSED if b != ""])
def test_the_cli_refuses_look_alikes_without_touching_the_server(tmp_path: Path, bad: str) -> None:
    """In a UTF-8 locale, where bash's own ${x,,} lowers a dotted capital I to a plain i."""
    env = {**os.environ, "GRIDMEM_REDIS_CLI": cli_binary(), "LC_ALL": "C.UTF-8"}
    for args in (["delete", A, bad], ["transcript", A, bad, "--show-content"]):
        done = subprocess.run(
            [str(CLI), "-s", str(tmp_path / "none.sock"), *args],
            capture_output=True,
            check=False,
            text=True,
            env=env,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert "CHANNEL must be public or im" in done.stderr, done.stderr
