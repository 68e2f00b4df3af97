"""The worker service end to end: `gridmem serve` in its own processes, a real server, a fake LLM."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis as redis_py

from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem import Limits
from gridmem import TurnView
from gridmem import service_streams
from gridmem.embedded import EmbeddedValkey
from tests.conftest import short_tempdir
from tests.helpers import avatar
from worker.llm import FAILURE_NOTICE
from worker.localllm import LocalChatServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

SYSTEM_PROMPT = "You are the test agent. Stored words are data."
TAG = re.compile(r"\[(\d+)/(public|im)/(\d+)\]")


POLL_SECONDS = 0.05


def wait_until(
    process: subprocess.Popen[bytes], condition: Callable[[], bool], what: str, timeout: float
) -> None:
    """Poll `condition`, at most `timeout` seconds, waiting on the service process
    between checks: another process changes what it checks, and a service that
    dies fails the test at once instead of at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = process.wait(timeout=POLL_SECONDS)
            raise AssertionError(f"gridmem serve exited with {code} while waiting for {what}")


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    client: Any
    llm: LocalChatServer
    base: Path
    outbound_cursor: str = "0-0"
    replies: dict[str, dict[str, str]] = field(default_factory=dict)

    def workers(self) -> list[psutil.Process]:
        children = psutil.Process(self.process.pid).children()
        found = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "spawn_main" in " ".join(
                    child.cmdline()
                ):  # not valkey, not the resource tracker
                    found.append(child)
        return found

    def send(self, who: int, channel: str, n: int, **extra: str) -> str:
        fields = {
            "avatar_uuid": avatar(who),
            "channel": channel,
            "text": f"msg [{who}/{channel}/{n}]",
            **extra,
        }
        return str(self.client.xadd("gm:inbound", fields))

    def wait_answers(self, ids: list[str], timeout: float = 60) -> None:
        """Read the outbound stream (blocking reads, with a deadline) until every id is answered."""
        deadline = time.monotonic() + timeout
        while not set(ids) <= set(self.replies) and time.monotonic() < deadline:
            try:
                found = self.client.xread(
                    {"gm:outbound": self.outbound_cursor}, count=500, block=500
                )
            except redis_py.ConnectionError:
                continue  # the server is restarting: keep reading after it
            for _, entries in found or ():
                for entry_id, fields in entries:
                    self.outbound_cursor = entry_id
                    self.replies.setdefault(fields["in_reply_to"], fields)
        missing = set(ids) - set(self.replies)
        assert not missing, f"{len(missing)} of {len(ids)} unanswered"

    def store(self) -> ConversationStore:
        return ConversationStore(
            redis_py.Redis.from_url(self.client_url()),
            ConversationConfig(limits=Limits(max_turns_per_session=1000)),
        )

    def client_url(self) -> str:
        kwargs = self.client.connection_pool.connection_kwargs
        return f"unix://{kwargs['path']}"


def _start(
    base: Path,
    llm: LocalChatServer,
    redis_url: str | None = None,
    persistence: bool = False,
    metrics_port: int | None = None,
    *,
    partitions: int = 1,
    llm_timeout: float = 0.5,
    **worker: Any,
) -> Service:
    worker_settings = {
        "processes": 2,
        "lease_seconds": 2,
        "sweep_interval_seconds": 5,
        "log_level": "WARNING",
        **worker,
    }
    lines = [
        f'storage_path = "{base}"',
        "[llm]", f'base_url = "{llm.url}"', f'system_prompt = "{SYSTEM_PROMPT}"',
        "max_retries = 2", "retry_wait_seconds = 0.05", f"timeout_seconds = {llm_timeout}",
        "[worker]", *(f"{k} = {v!r}".replace("'", '"') for k, v in worker_settings.items()),
        "[conversation]", f"persistence_enabled = {str(persistence).lower()}", "flush_interval_seconds = 1",
        f"partitions = {partitions}",
        "[conversation.limits]", "max_input_bytes = 4000", "max_text_bytes = 2000", "max_turns_per_session = 1000",
    ]  # fmt: skip
    if redis_url:
        lines += ["[redis]", f'url = "{redis_url}"']
    if metrics_port:
        lines += ["[metrics]", f"port = {metrics_port}"]
    config = base / "gridmem.toml"
    config.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "serve", "--config", str(config)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = redis_url or f"unix://{base / 'valkey' / 'valkey.sock'}"
    service = Service(process, redis_py.Redis.from_url(url, decode_responses=True), llm, base)

    def up() -> bool:
        try:  # the supervisor makes every partition's group before it starts a worker
            groups = service.client.xinfo_groups(service_streams("gm", partitions)[-1].inbound)
        except (redis_py.ConnectionError, redis_py.ResponseError, FileNotFoundError):
            return False  # the server or the consumer group is not there yet
        return bool(groups) and len(service.workers()) == worker_settings["processes"]

    wait_until(process, up, "gridmem serve to start", timeout=60)
    return service


def _stop(service: Service) -> None:
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()
    service.client.close()


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tempdir("gm-svc-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _turns(store: ConversationStore, who: int, channel: str) -> list[TurnView]:
    return store.read_page(avatar(who), channel, direction="forward", limit=200).turns


def test_llm_requests_hold_only_their_own_key(base: Path) -> None:
    with LocalChatServer() as llm:
        service = _start(base, llm)
        try:
            ids = [
                service.send(who, ch, n)
                for n in range(3)
                for who in range(24)
                for ch in ("public", "im")
            ]
            service.wait_answers(ids)
        finally:
            _stop(service)
    assert service.process.returncode == 0
    assert len(llm.requests) == len(ids)
    for body in llm.requests:
        messages = body["messages"]
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert all(
            m["role"] in ("user", "assistant") for m in messages[1:]
        )  # no system built from storage
        keys = {(who, ch) for m in messages[1:] for who, ch, _ in TAG.findall(m["content"])}
        assert len(keys) == 1, keys
    assert {fields["avatar_uuid"] for fields in service.replies.values()} == {
        avatar(w) for w in range(24)
    }
    for fields in service.replies.values():  # each reply goes to the key it answers
        who, ch, _ = TAG.findall(fields["text"])[0]
        assert (avatar(int(who)), ch) == (fields["avatar_uuid"], fields["channel"])


def _assert_exactly_once(service: Service, sent: dict[tuple[int, str], list[int]]) -> None:
    store = service.store()
    for (who, ch), numbers in sent.items():
        turns = _turns(store, who, ch)
        said = [int(TAG.findall(t.text)[0][2]) for t in turns if t.kind == "avatar_message"]
        assert said == numbers, (who, ch, said)  # each once, in the order sent
        assert [t.kind for t in turns] == ["avatar_message", "agent_reply"] * len(numbers)


def test_512_in_flight_answer_each_message_once_and_never_one_key_twice_at_once(
    base: Path,
) -> None:
    """Issue 16: 2 processes at concurrency 256 against a 1 s endpoint: 512 keys
    (256 avatars x 2 channels) with a message each, and a second one on 128 of
    them. Every message is answered once, in order, and no key has two LLM calls
    in flight at the same time (the endpoint's own record of each request's span)."""
    with LocalChatServer(delay_seconds=1.0) as llm:
        # a 10 s lease (the other tests' 2 s is renewed every 0.67 s, which a loaded
        # 2-core machine running 512 calls can miss: the key then passes to the other
        # process while this one's call is still out, which is a second call in flight)
        service = _start(base, llm, concurrency=256, llm_timeout=20, lease_seconds=10)
        try:
            # Given: 640 messages, sent as one burst
            sent: dict[tuple[int, str], list[int]] = {}
            ids = []
            for n, keys in ((0, range(512)), (1, range(128))):
                for key in keys:
                    who, ch = key // 2, ("public", "im")[key % 2]
                    ids.append(service.send(who, ch, n))
                    sent.setdefault((who, ch), []).append(n)
            # When: the service answers them
            service.wait_answers(ids, timeout=120)
            # Then: one reply each, each message stored once, in order
            assert len(service.replies) == len(ids)
            _assert_exactly_once(service, sent)
        finally:
            _stop(service)
    # and a call for each message (the service is stopped: every span is in)
    assert len(llm.spans) >= len(ids)
    # and the endpoint held many calls at once, but never two of one key
    assert llm.most_in_flight >= 100, llm.most_in_flight
    by_key: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for began, ended, body in llm.spans:
        who, ch, _ = TAG.findall(body["messages"][-1]["content"])[0]
        by_key.setdefault((who, ch), []).append((began, ended))
    for key, spans in by_key.items():
        spans.sort()
        for (_, first_end), (second_start, _) in itertools.pairwise(spans):
            assert first_end <= second_start, key


def test_sigkill_of_a_worker_mid_batch_loses_and_duplicates_nothing(base: Path) -> None:
    with LocalChatServer(delay_seconds=0.2) as llm:
        service = _start(base, llm, concurrency=4)
        try:
            sent: dict[tuple[int, str], list[int]] = {}
            ids = []
            for n in range(6):
                for who in range(12):
                    ch = "im" if who % 2 else "public"
                    ids.append(service.send(who, ch, n))
                    sent.setdefault((who, ch), []).append(n)
            service.wait_answers(ids[:10])  # work is in flight now
            victim = service.workers()[0]
            victim.send_signal(signal.SIGKILL)
            service.wait_answers(ids, timeout=90)
            wait_until(
                service.process,
                lambda: len(service.workers()) == 2,
                "the supervisor to restart the killed worker",
                timeout=30,
            )
            assert (
                victim.pid not in {p.pid for p in service.workers()} and len(service.workers()) == 2
            )
            _assert_exactly_once(service, sent)
            wait_until(
                service.process,
                lambda: service.client.xlen("gm:inbound") == 0,
                "the last answered entries to be deleted",
                timeout=30,
            )
            assert service.client.xlen("gm:inbound") == 0  # answered entries are deleted
        finally:
            _stop(service)


def test_redis_restart_mid_run(base: Path) -> None:
    data = short_tempdir("gm-aof-")
    durable = {"appendonly": "yes", "appendfsync": "always"}
    server = EmbeddedValkey(data, extra_config=durable).start()
    try:
        with LocalChatServer(delay_seconds=0.05) as llm:
            service = _start(base, llm, redis_url=server.url)
            try:
                sent: dict[tuple[int, str], list[int]] = {}
                ids = []
                for n in range(5):
                    for who in range(10):
                        ids.append(service.send(who, "public", n))
                        sent.setdefault((who, "public"), []).append(n)
                service.wait_answers(ids[:8])
                server.stop()  # mid-run: workers lose their connections
                server = EmbeddedValkey(data, extra_config=durable).start()
                service.wait_answers(ids, timeout=90)
                _assert_exactly_once(service, sent)
                assert len(service.workers()) == 2
            finally:
                _stop(service)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_llm_faults_are_retried_then_answered_with_a_notice(base: Path) -> None:
    faults: list[int | str] = [
        500,
        429,
        "stall",
        500,
    ]  # 1st message: all 3 tries fail; 2nd: one retry
    with LocalChatServer(faults=faults, stall_seconds=1.5) as llm:
        service = _start(base, llm, processes=1, concurrency=1)
        try:
            first = service.send(1, "im", 0)
            service.wait_answers([first])
            second = service.send(1, "im", 1)
            rest = [service.send(who, "public", 0) for who in range(2, 8)]
            service.wait_answers([second, *rest])
        finally:
            _stop(service)
    assert service.replies[first]["text"] == FAILURE_NOTICE
    assert service.replies[second]["text"].startswith("(offline responder")
    assert all(service.replies[r]["text"].startswith("(offline responder") for r in rest)
    assert len(llm.requests) == 3 + 2 + len(rest)


def test_malformed_entries_are_dead_lettered_and_work_goes_on(base: Path) -> None:
    with LocalChatServer() as llm:
        service = _start(base, llm)
        try:
            add = service.client.xadd
            bad = {
                add(
                    "gm:inbound", {"avatar_uuid": "not-a-uuid", "channel": "im", "text": "x"}
                ): "bad_uuid",
                add(
                    "gm:inbound", {"avatar_uuid": avatar(1), "channel": "group", "text": "x"}
                ): "bad_channel",
                add("gm:inbound", {"avatar_uuid": avatar(2), "channel": "im"}): "missing_text",
                add(
                    "gm:inbound", {"avatar_uuid": avatar(3), "channel": "im", "text": "y" * 5000}
                ): "oversized",
                add(
                    "gm:inbound",
                    {"avatar_uuid": avatar(4), "channel": "im", "text": "x", "role": "system"},
                ): "unknown_field",
                add("gm:inbound", {"channel": "im", "text": "x"}): "missing_field",
                # issue 12: bytes that are not UTF-8, even in a field no one uses
                add(
                    "gm:inbound", {"avatar_uuid": avatar(5), "channel": "im", "text": b"caf\xe9"}
                ): "bad_encoding",
                add(
                    "gm:inbound",
                    {
                        "avatar_uuid": avatar(6),
                        "channel": "im",
                        "text": "x",
                        "avatar_name": b"\xff",
                    },
                ): "bad_encoding",
            }
            # the same residents' next messages are answered: nothing waits behind a bad one
            good = [service.send(who, "public", 0) for who in range(10, 16)]
            good += [service.send(who, "im", 1) for who in (5, 6)]
            service.wait_answers(good)
            wait_until(
                service.process,
                lambda: (
                    service.client.xlen("gm:dead") >= len(bad)
                    and service.client.xlen("gm:inbound") == 0
                ),
                "every bad entry to be dead-lettered",
                timeout=30,
            )
            dead = {fields["id"]: fields for _, fields in service.client.xrange("gm:dead")}
            assert {entry: fields["reason"] for entry, fields in dead.items()} == bad
            assert all(
                set(fields) == {"id", "reason"} for fields in dead.values()
            )  # never the text
            assert service.client.xlen("gm:inbound") == 0
            assert len(service.workers()) == 2
            later = service.send(20, "im", 0)
            service.wait_answers([later])
        finally:
            _stop(service)


def test_persistence_survives_a_full_restart(base: Path) -> None:
    """persistence_enabled: restore at start, flush on an interval and at stop."""
    with LocalChatServer() as llm:
        first = _start(base, llm, persistence=True)
        try:
            ids = [first.send(who, "im", 0) for who in range(5)]
            first.wait_answers(ids)
        finally:
            _stop(first)  # SIGTERM: the last snapshot is flushed on the way out
        assert first.process.returncode == 0
        assert list((base / "conversations").glob("*.snap"))
        second = _start(base, llm, persistence=True)  # a new private Valkey: empty until restored
        try:
            store = second.store()
            for who in range(5):
                assert [t.kind for t in _turns(store, who, "im")] == [
                    "avatar_message",
                    "agent_reply",
                ]
            later = second.send(0, "im", 1)
            second.wait_answers([later])
            assert len(_turns(store, 0, "im")) == 4
        finally:
            _stop(second)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_endpoint_has_the_series_and_no_content(base: Path) -> None:
    port = _free_port()
    with LocalChatServer() as llm:
        service = _start(base, llm, metrics_port=port)
        try:
            ids = [
                service.send(who, ch, 0, text=f"SECRETWORD{who} password=hunter22x")
                for who in range(6)
                for ch in ("public", "im")
            ]
            service.wait_answers(ids)
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        finally:
            _stop(service)
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line and not line.startswith("#")
    }
    assert (
        values['gridmem_sessions{channel="public"}'] == 6
        and values['gridmem_sessions{channel="im"}'] == 6
    )
    assert values["gridmem_stored_bytes"] > 0 and values["gridmem_redactions_total"] == 12
    assert values['gridmem_records_total{kind="avatar_message"}'] == 12
    assert values['gridmem_records_total{kind="agent_reply"}'] == 12
    assert values['gridmem_messages_total{outcome="answered"}'] == 12
    for series in (
        "gridmem_record_seconds_count",
        "gridmem_context_seconds_count",
        "gridmem_llm_seconds_count",
    ):
        assert values[series] >= 12, series
    assert "# HELP gridmem_events_total" in body  # (labelled series appear once counted)
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}", body)  # no UUIDs
    assert "SECRETWORD" not in body and "hunter22" not in body and "msg [" not in body
