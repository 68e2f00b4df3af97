"""Nothing secret on the wire: MONITOR sees every command while secrets are recorded."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis as redis_py

from tests.helpers import avatar, dump_all
from tests.test_redaction import REQUIRED
from worker import ActionResult, AvatarMessage, ConversationStore, ManualClock, ToolSummary
from worker.embedded import EmbeddedValkey
from worker.redaction import RULES, Redactor

pytestmark = pytest.mark.real

STOP = "gm-monitor-stop"


def _secrets() -> list[str]:
    """Every secret part the rule table and the required families can produce."""
    found = set()
    for rule in RULES:
        alone = Redactor((rule,))
        for example in rule.positives:
            found.update(secret for _, secret in alone.secrets(example))
    for example in REQUIRED.values():
        found.update(secret for _, secret in Redactor().secrets(example))
    # a "secret" that is a few common characters would also match innocent text
    return sorted(s for s in found if len(s) >= 6)


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


def test_no_secret_reaches_redis(real_servers: dict[str, EmbeddedValkey]) -> None:
    server = real_servers["valkey"]
    client = server.client()
    client.flushall()
    secrets = _secrets()
    assert len(secrets) > 60
    texts = [rule_example for rule in RULES for rule_example in rule.positives]
    texts += [f"here you go: {v} (don't share)" for v in REQUIRED.values()]
    monitor = Monitor(server.client(decode_responses=True))
    monitor.start()
    store = ConversationStore(client, clock=ManualClock())
    contexts = []
    for n, text in enumerate(texts):
        who = avatar(n % 7)
        store.record(who, "public", AvatarMessage(text=text), idempotency_key=f"{n}-0")
        store.record(who, "im", ToolSummary(tool="web.fetch", summary=text))
        store.record(who, "im", ActionResult(action="pay", status="denied", detail=text))
        contexts += [m.content for ch in ("public", "im") for m in store.context(who, ch)]
    client.echo(STOP)
    monitor.join(timeout=30)
    assert not monitor.is_alive()
    wire = "\n".join(monitor.commands)
    stored = dump_all(client)
    shown = "\n".join(contexts)
    # the monitor saw the recording traffic (and the markers it carried)
    assert "FCALL" in wire and "[REDACTED:" in wire
    for secret in secrets:
        assert secret not in wire, secret
        assert secret not in stored, secret
        assert secret not in shown, secret


def test_monitor_would_see_a_leak(real_servers: dict[str, Any]) -> None:
    """The check above can fail: an unredacted write is visible to it."""
    client = real_servers["valkey"].client()
    monitor = Monitor(real_servers["valkey"].client(decode_responses=True))
    monitor.start()
    client.set("probe", "sk-proj-Zq8xW2rT9vB4nM1kLp0aZq8x")
    client.echo(STOP)
    monitor.join(timeout=30)
    assert any("sk-proj-Zq8xW2rT9vB4nM1kLp0aZq8x" in c for c in monitor.commands)
