"""Nothing secret on the wire: MONITOR sees every command while secrets are recorded.

Every family of the secret corpus (tests/secret_corpus.py), plain and under every
obfuscation, is recorded through the store as each kind of record. The expected
secrets are the corpus's own: no rule is asked which part of a text is secret.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis as redis_py

from gridmem import ActionResult
from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import ManualClock
from gridmem import ToolSummary
from gridmem.embedded import EmbeddedValkey
from tests.helpers import avatar
from tests.helpers import dump_all
from tests.secret_corpus import FAMILIES
from tests.secret_corpus import WRAPPERS
from tests.secret_corpus import Case
from tests.secret_corpus import instance
from tests.secret_corpus import leaks_all
from tests.secret_corpus import tool_instance

pytestmark = pytest.mark.real

STOP = "gm-monitor-stop"


class Monitor(threading.Thread):
    """Records every command the server executes until it sees ECHO STOP."""

    def __init__(self, client: redis_py.Redis) -> None:
        super().__init__(daemon=True)
        self.commands: list[str] = []
        self._client = client  # closing the client would close the monitor's connection
        self._monitor = client.monitor()
        self._monitor.__enter__()

    def run(self) -> None:
        while True:
            command = self._monitor.next_command()["command"]
            self.commands.append(command)
            if STOP in command:
                return


def wire_cases() -> list[Case]:
    """Two instances of every family, plain and under every obfuscation."""
    return [
        instance(family, seed, wrapper)
        for family in sorted(FAMILIES)
        for wrapper in [None, *sorted(WRAPPERS)]
        for seed in (11, 12)
    ]


def test_no_secret_reaches_redis(real_servers: dict[str, EmbeddedValkey]) -> None:
    """Every command the server runs while every family is recorded: no run of a secret."""
    server = real_servers["valkey"]
    client = server.client()
    client.flushall()
    cases = wire_cases()
    tool_cases = [
        tool_instance(seed, wrapper) for seed in (11, 12) for wrapper in [None, *sorted(WRAPPERS)]
    ]
    assert len({case.family for case in cases}) == len(FAMILIES) >= 40
    # Given a monitor on the server, and a store that compacts often (summary lines too)
    monitor = Monitor(server.client(decode_responses=True))
    monitor.start()
    store = ConversationStore(
        client, ConversationConfig(limits=Limits(max_turns_per_session=4)), clock=ManualClock()
    )
    # When every case is recorded as every kind of record, and read back
    contexts = []
    for n, case in enumerate(cases):
        who = avatar(n % 11)
        text = f"here you go: {case.text} (don't share)"
        store.record(who, "public", AvatarMessage(text=text), idempotency_key=f"{n}-0")
        store.record(who, "public", AgentReply(text=text))
        store.record(who, "im", ToolSummary(tool="web.fetch", summary=text))
        store.record(who, "im", ActionResult(action="pay", status="denied", detail=text))
        contexts += [m.content for ch in ("public", "im") for m in store.context(who, ch)]
    # and tools named like a secret, their summary the bare value
    for n, (tool, case) in enumerate(tool_cases):
        store.record(avatar(n % 11), "im", ToolSummary(tool=tool, summary=case.text))
    cases += [case for _, case in tool_cases]
    client.echo(STOP)
    monitor.join(timeout=30)
    assert not monitor.is_alive()
    # Then the monitor saw the traffic, and no run of any secret in it, in the store or shown
    wire = "\n".join(monitor.commands)
    assert "FCALL" in wire and "[REDACTED:" in wire
    assert leaks_all(cases, wire) == {}
    assert leaks_all(cases, dump_all(client)) == {}
    assert leaks_all(cases, "\n".join(contexts)) == {}


def test_monitor_would_see_a_leak(real_servers: dict[str, Any]) -> None:
    """The check above can fail: an unredacted (or obfuscated) write is visible to it."""
    client = real_servers["valkey"].client()
    monitor = Monitor(real_servers["valkey"].client(decode_responses=True))
    monitor.start()
    plain, hidden = instance("github", 1), instance("anthropic", 1, "zero-width")
    client.set("probe", plain.text)
    client.set("probe2", hidden.text)
    client.echo(STOP)
    monitor.join(timeout=30)
    wire = "\n".join(monitor.commands)
    assert set(leaks_all([plain, hidden], wire)) == {"github", "anthropic"}
