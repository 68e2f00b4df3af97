"""One Worker in this process, on every backend: poison, bad bytes, unusable replies, huge input.

tests/test_service.py runs `gridmem serve` in real processes; here a Worker runs
on this test's event loop, against fakeredis and the real servers, so a fault
can be injected at any step of answering an entry and the outcome read back
from the streams. Each test waits for the worker to send something (every write
of its goes through its executor), then reads the streams again, with a deadline;
never on time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import fakeredis
import pytest

from gridmem.clock import ManualClock
from gridmem.config import Settings
from gridmem.embedded import EmbeddedValkey
from gridmem.replies import Chained
from gridmem.replies import ScriptCall
from gridmem.store import AsyncConversationStore
from gridmem.store import connect_async
from tests.helpers import avatar
from worker.llm import FAILURE_NOTICE
from worker.llm import Message

INBOUND, OUTBOUND, DEAD = "gm:inbound", "gm:outbound", "gm:dead"
ATTEMPTS = "{gm:inbound}:attempts"
DEADLINE = 20.0  # seconds: generous for a loaded 2-core CI box; a pass takes well under 1


@pytest.fixture
def new_client(backend: str, request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Makes asyncio clients of one clean server of the parametrized backend."""
    if backend == "fake":
        server = fakeredis.FakeServer()
        yield lambda: fakeredis.FakeAsyncRedis(server=server)
        return
    servers: dict[str, EmbeddedValkey] = request.getfixturevalue("real_servers")
    real = servers[backend]
    with real.client() as sync:
        sync.flushall()
        sync.function_flush()
    yield lambda: connect_async(real.url)


class ScriptedChat:
    """A ChatClient that answers "ok: <n>" (n = how many calls so far), or what `replies`
    says for a message holding a given word; every call's last user message is kept."""

    name = "scripted"

    def __init__(self, replies: dict[str, str] | None = None) -> None:
        self.replies = replies or {}
        self.asked: list[str] = []
        self.fault: Callable[[str], None] = lambda last: None

    async def complete(self, messages: list[Message]) -> str:
        last = [m["content"] for m in messages if m["role"] == "user"][-1]
        self.asked.append(last)
        self.fault(last)
        for word, reply in self.replies.items():
            if word in last:
                return reply
        return f"ok: {len(self.asked)}"

    async def aclose(self) -> None:
        return None


@dataclass
class Run:
    """A running Worker and what it wrote."""

    client: Any
    store: AsyncConversationStore
    worker: Any
    chat: ScriptedChat
    settings: Settings
    replies: dict[str, dict[str, str]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # in_reply_to, in outbound order
    # set each time the worker's executor has answered a call: it may have written
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    _cursor: str = "0-0"

    async def send(
        self, who: int, text: str | bytes, channel: str = "im", extra: dict[Any, Any] | None = None
    ) -> str:
        fields = {"avatar_uuid": avatar(who), "channel": channel, "text": text, **(extra or {})}
        entry: bytes = await self.client.xadd(INBOUND, fields)
        return entry.decode()

    async def dead(self) -> dict[str, dict[str, str]]:
        rows = await self.client.xrange(DEAD)
        decoded = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in rows]
        return {fields["id"]: fields for fields in decoded}

    async def read_outbound(self) -> None:
        for entry_id, fields in await self.client.xrange(OUTBOUND, f"({self._cursor}"):
            self._cursor = entry_id.decode()
            reply = {k.decode(): v.decode() for k, v in fields.items()}
            self.replies.setdefault(reply["in_reply_to"], reply)
            self.order.append(reply["in_reply_to"])

    async def until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        """Read the streams until `check` holds: again each time the worker has sent a
        command (it may have written what `check` looks for), failing at the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while True:
            self.sent.clear()  # before reading: a write that lands meanwhile sets it again
            await self.read_outbound()
            if await check():
                return
            try:
                await asyncio.wait_for(self.sent.wait(), deadline - loop.time())
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}") from None

    def watch(self) -> None:
        """Set `sent` whenever the worker's executor has answered a call or a command."""
        watch(self.store, self.sent)

    async def answered(self, *ids: str) -> None:
        async def done() -> bool:
            return set(ids) <= set(self.replies)

        await self.until(done, f"answers to {ids}")

    async def dead_lettered(self, *ids: str) -> None:
        async def done() -> bool:
            return set(ids) <= set(await self.dead())

        await self.until(done, f"dead letters for {ids}")


@asynccontextmanager
async def running(
    new_client: Callable[[], Any], chat: ScriptedChat | None = None, **worker: Any
) -> AsyncIterator[Run]:
    from worker.service import Worker

    settings = Settings(
        worker={"concurrency": 4, **worker},
        conversation={"limits": {"max_input_bytes": 1 << 20, "max_text_bytes": 2000}},
    )
    client = new_client()
    store = AsyncConversationStore(new_client(), settings.conversation, clock=ManualClock())
    chat = chat or ScriptedChat()
    run = Run(client, store, Worker(store, chat, settings, name="w-test"), chat, settings)
    run.watch()
    task = asyncio.create_task(run.worker.run())
    try:
        yield run
    finally:
        run.worker.stop()
        await asyncio.wait_for(task, DEADLINE)
        await store.aclose()
        await client.aclose()


def watch(store: AsyncConversationStore, answered: asyncio.Event | None = None) -> asyncio.Event:
    """An event (`answered`, or a new one) set each time the store's executor has
    answered a call or a command."""
    event = answered or asyncio.Event()
    executor: Any = store.executor
    for name in ("call", "command"):
        send = getattr(executor, name)

        async def sending(*args: Any, _send: Any = send) -> Any:
            try:
                return await _send(*args)
            finally:
                event.set()

        setattr(executor, name, sending)
    return event


def go(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 3 * DEADLINE))


# -- item 2: one bad byte must never wedge a conversation ----------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"text": b"caf\xe9 ok"},  # Latin-1, not UTF-8
        {"text": "hi", "avatar_name": b"\xff\xfeAnn"},  # a field the worker never uses
        {"text": b"half \xe2\x82"},  # a cut multi-byte character
        {"text": b"surrogate \xed\xa0\x80"},  # UTF-8 of a lone surrogate: not UTF-8
        {"text": "hi", b"\xffname": "x"},  # the field's name itself
    ],
)
def test_undecodable_fields_are_dead_lettered_and_the_key_goes_on(
    new_client: Callable[[], Any], fields: dict[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 12): an invalid UTF-8 byte in any field raised while the entry
    was read, before the rejection path; the key was retried every lease, forever, and
    every later message of that avatar waited behind it."""

    async def scenario() -> None:
        async with running(new_client) as run:
            # Given a resident's entry with undecodable bytes, then an ordinary one
            extra = {k: v for k, v in fields.items() if k != "text"}
            bad = await run.send(1, fields["text"], extra=extra)
            good = await run.send(1, "are you there?")
            # Then the bad one is dead-lettered bad_encoding and the next is answered
            await run.dead_lettered(bad)
            await run.answered(good)
            assert await run.dead() == {bad: {"id": bad, "reason": "bad_encoding"}}
            assert run.chat.asked and all("are you there?" in m for m in run.chat.asked)
            assert await run.client.xlen(INBOUND) == 0
            assert await run.client.hlen(ATTEMPTS) == 0

    caplog.set_level(logging.DEBUG, logger="gridmem")
    go(scenario())
    assert "Ann" not in caplog.text and "caf" not in caplog.text  # codes and IDs only


STEPS = ["decode", "record", "context", "llm", "record_reply", "publish"]


class Faults:
    """Makes one step of answering raise for the entry `poisoned` (its text holds POISON).

    Each injected failure is appended to `seen`. The exception's message quotes the
    text, as some libraries' messages do: it must not reach the logs.
    """

    def __init__(self, run: Run, poisoned: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.run, self.poisoned, self.patch = run, poisoned, monkeypatch
        self.store: Any = run.store
        self.seen: list[str] = []

    def inject(self, step: str) -> None:
        getattr(self, step)()

    def fail(self, step: str) -> None:
        self.seen.append(step)
        raise RuntimeError(f"injected at {step}: said POISON words")

    def decode(self) -> None:
        import worker.service

        decode = worker.service.decode_inbound

        def decoding(raw: Any, limit: int) -> Any:
            if any(b"POISON" in value for _, value in raw):
                self.fail("decode")
            return decode(raw, limit)

        self.patch.setattr(worker.service, "decode_inbound", decoding)

    def record(self) -> None:
        fused = self.store.record_and_context

        async def recording(
            uuid: str, channel: str, item: Any, key: Any = None, **budget: Any
        ) -> Any:
            if key == self.poisoned:  # the entry's own record, not its reply's
                self.fail("record")
            return await fused(uuid, channel, item, key, **budget)

        self.patch.setattr(self.store, "record_and_context", recording)

    def context(self) -> None:
        """The words recorded, the context read with them: then the failure."""
        fused = self.store.record_and_context

        async def reading(*args: Any, **kwargs: Any) -> Any:
            receipt, messages = await fused(*args, **kwargs)
            if "POISON" in [m.content for m in messages if m.role == "user"][-1]:
                self.fail("context")
            return receipt, messages

        self.patch.setattr(self.store, "record_and_context", reading)

    def llm(self) -> None:
        def asking(last: str) -> None:
            if "POISON" in last:
                self.fail("llm")

        self.run.chat.fault = asking

    def record_reply(self) -> None:
        """The answer's record (alone, or chained with the entry's finish) fails."""
        for name in ("record_in_session", "record_in_session_then"):
            self.patch.setattr(self.store, name, self._failing_reply(getattr(self.store, name)))

    def _failing_reply(self, original: Any) -> Any:
        async def recording(*args: Any, **kwargs: Any) -> Any:
            if args[4] == f"{self.poisoned}:reply":  # the idempotency key
                self.fail("record_reply")
            return await original(*args, **kwargs)

        return recording

    def publish(self) -> None:
        run_call = self.store.executor.call

        async def running_call(call: Any) -> Any:
            # every command goes through the executor: the reply's XADD to gm:outbound
            # too, alone (outbound in another cluster slot) or in publish_and_finish,
            # itself alone or chained behind the answer's record
            for part in (call, getattr(call, "then", None)):
                commands = getattr(part, "commands", ())
                if any(c[:2] == ("XADD", OUTBOUND) and self.poisoned in c for c in commands):
                    self.fail("publish")
                script = getattr(part, "script", None)
                if script and script.name == "publish_and_finish" and self.poisoned in part.args:
                    self.fail("publish")
            return await run_call(call)

        self.patch.setattr(self.store.executor, "call", running_call)


@pytest.mark.parametrize("step", STEPS)
def test_an_entry_failing_at_any_step_is_dead_lettered_poison_and_the_key_recovers(
    new_client: Callable[[], Any],
    step: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression (issue 12): an unexpected error while answering an entry left its key
    leased until the lease ran out, then the next worker failed the same way, forever.
    Now each failed attempt is counted in Redis and retried at once; after max_attempts
    the entry is dead-lettered `poison` and the key's next entry is answered."""
    attempts = 3

    async def scenario() -> None:
        # lease_seconds far above the deadline: recovery must not wait for a lease
        async with running(new_client, max_attempts=attempts, lease_seconds=600) as run:
            # Given a poisoned entry of one key, the key's next entry, and another key's
            poisoned = await run.send(1, "these are POISON words")
            faults = Faults(run, poisoned, monkeypatch)
            faults.inject(step)
            after = await run.send(1, "and then this")
            other = await run.send(2, "meanwhile, elsewhere", channel="public")
            # When the worker has been at it
            await run.answered(after, other)
            await run.dead_lettered(poisoned)
            # Then the poisoned entry was tried exactly max_attempts times, then dead-lettered
            assert faults.seen == [step] * attempts
            assert await run.dead() == {poisoned: {"id": poisoned, "reason": "poison"}}
            assert poisoned not in run.replies
            # And the key went on in order; counters and entries are gone
            assert run.order.index(after) >= 0 and run.replies[after]["avatar_uuid"] == avatar(1)
            assert await run.client.xlen(INBOUND) == 0
            assert await run.client.hlen(ATTEMPTS) == 0
            assert run.worker.stats["failed_attempts"] == attempts

    caplog.set_level(logging.DEBUG, logger="gridmem")
    go(scenario())
    assert "POISON" not in caplog.text  # no text in logs, even from an exception's message
    assert f"attempt {attempts} of {attempts} failed" in caplog.text


async def _die_during_an_attempt(
    store: AsyncConversationStore, member: str, owner: str, entry_id: str, before: int
) -> None:
    """What a worker that dies mid-attempt leaves in Redis: its claim and its counted
    attempt (the caller then drops its lease, as its expiry would)."""
    from gridmem.keys import KeySpace
    from gridmem.scripts import Scripts

    keys, scripts = KeySpace().service(), Scripts()
    step = await store.executor.call(
        scripts.claim_key(keys, member=member, owner=owner, lease_ms=60_000)
    )
    assert (step.entry_id, step.attempts, step.silent) == (entry_id, before, before)
    count = await store.executor.call(
        scripts.begin_attempt(keys, member=member, owner=owner, entry_id=entry_id, token=owner)
    )
    assert (count.attempts, count.silent) == (before + 1, before)


def test_attempts_of_workers_that_died_count_across_restarts(
    new_client: Callable[[], Any],
) -> None:
    """An entry that killed (or stalled) the workers that held it: the attempts they
    started are in Redis, so the next worker dead-letters it without trying again."""
    from gridmem.keys import KeySpace
    from gridmem.scripts import Scripts

    async def scenario() -> None:
        client = new_client()
        store = AsyncConversationStore(client, Settings().conversation, clock=ManualClock())
        keys, scripts = KeySpace().service(), Scripts()
        # Given three workers that each claimed the key's head and died (leases gone)
        await store.executor.call(scripts.ensure_group(keys, group="workers"))
        fields = {"avatar_uuid": avatar(1), "channel": "im", "text": "deadly"}
        poisoned = (await client.xadd(INBOUND, fields)).decode()
        await store.executor.call(
            scripts.take_inbound(keys, group="workers", consumer="gone", count=10)
        )
        member = f"{avatar(1)}:im"
        for n in range(3):
            await _die_during_an_attempt(store, member, f"dead{n}", poisoned, n)
            await client.delete(f"{{gm:inbound}}:owner:{member}")
        await client.aclose()
        # When a new worker starts (it adopts the orphaned key) with a message waiting after it
        async with running(new_client, max_attempts=3) as run:
            after = await run.send(1, "still there?")
            await run.answered(after)
            await run.dead_lettered(poisoned)
            # Then the deadly entry was never tried again: the model saw only the next one
            assert await run.dead() == {poisoned: {"id": poisoned, "reason": "poison"}}
            assert len(run.chat.asked) == 1 and "still there?" in run.chat.asked[0]
            assert await run.client.hlen(ATTEMPTS) == 0

    go(scenario())


def test_connection_faults_are_not_counted_as_attempts(
    new_client: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis unreachable in the middle of an entry, max_attempts times and more: the
    worker resumes the same attempt once Redis answers, and the entry is answered."""
    import redis as redis_py

    async def scenario() -> None:
        async with running(new_client, max_attempts=1) as run:
            store: Any = run.store
            fused = store.record_and_context
            faults: list[int] = []

            async def unreachable_at_first(*args: Any, **kwargs: Any) -> Any:
                if len(faults) < 3:
                    faults.append(1)
                    raise redis_py.ConnectionError("injected")
                return await fused(*args, **kwargs)

            monkeypatch.setattr(store, "record_and_context", unreachable_at_first)
            entry = await run.send(1, "hello")
            await run.answered(entry)
            assert len(faults) == 3 and await run.dead() == {}
            assert len(run.chat.asked) == 1

    go(scenario())


# -- item 2: a reply that cannot be stored as given ----------------------------------------

UNUSABLE = {
    "SURROGATE": ("half \ud83d of an emoji", "half \ufffd of an emoji"),
    "CONTROL": ("\x01\x02\x03\x7f", FAILURE_NOTICE),
    "INVISIBLE": (" \u200b\u2060\ufeff\n\t", FAILURE_NOTICE),
    "LONESOME": ("\udc00\udc01", FAILURE_NOTICE),
    "TAGS": ("\U000e0041\U000e0042\u202e\u2066\ufe0f\u3164", FAILURE_NOTICE),  # second pass
    "HUGE": ("y" * ((1 << 20) + 10), None),  # over the input ceiling: cut, then bounded
}


def test_llm_replies_that_cannot_be_stored_as_given_are_cleaned_or_replaced(
    new_client: Callable[[], Any],
) -> None:
    """Regression (issue 12): a reply with a lone surrogate was refused by the store, so
    the entry failed and the model was asked again every lease, forever; the resident
    never got the failure notice."""
    chat = ScriptedChat({word: reply for word, (reply, _) in UNUSABLE.items()})

    async def scenario() -> None:
        async with running(new_client, chat) as run:
            ids = {word: await run.send(n, f"please say {word}") for n, word in enumerate(UNUSABLE)}
            await run.answered(*ids.values())
            for word, (_, expected) in UNUSABLE.items():
                published = run.replies[ids[word]]["text"]
                if expected is not None:
                    assert published == expected, word
            huge = run.replies[ids["HUGE"]]["text"]
            assert huge.startswith("y" * 1000) and huge.endswith("[truncated]")
            assert len(huge.encode()) <= run.settings.conversation.limits.max_text_bytes
            assert len(chat.asked) == len(UNUSABLE)  # each asked once, never again
            assert await run.dead() == {}

    go(scenario())


def test_a_reply_the_store_refuses_is_answered_with_the_failure_notice(
    new_client: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever else the store refuses in a model's reply (its rules may grow), the
    resident gets the failure notice and the model is not asked again."""
    from gridmem.errors import InvalidRecord

    async def scenario() -> None:
        async with running(new_client) as run:
            store: Any = run.store

            def refusing(original: Any) -> Any:
                async def recording(
                    uuid: str, channel: str, item: Any, *rest: Any, **kw: Any
                ) -> Any:
                    if getattr(item, "kind", "") == "agent_reply" and item.text != FAILURE_NOTICE:
                        raise InvalidRecord("text", "refused by a rule of the store")
                    return await original(uuid, channel, item, *rest, **kw)

                return recording

            # the answer's record: alone, or chained with the entry's finish
            for name in ("record_in_session", "record_in_session_then"):
                monkeypatch.setattr(store, name, refusing(getattr(store, name)))
            entry = await run.send(1, "hello")
            await run.answered(entry)
            assert run.replies[entry]["text"] == FAILURE_NOTICE
            assert len(run.chat.asked) == 1 and await run.dead() == {}

    go(scenario())


def _calls_by_kind(store: AsyncConversationStore) -> Counter[str]:
    """Counts what the store's executor is asked to send from now on, by kind: a
    script by its name, a chained call as `<write>+<then>`, commands by their name."""
    seen: Counter[str] = Counter()
    executor: Any = store.executor
    call, command = executor.call, executor.command

    def kind(part: Any) -> str:
        script = getattr(part, "script", None)
        return script.name if script is not None else "reads"

    async def calling(sent: Any) -> Any:
        # counted as sent, not once answered: the reply of a publishing call is out
        # (and the test may look) before this coroutine runs again; a claim is told
        # apart by its reply, and the message it begins is answered after it
        if isinstance(sent, Chained):
            seen[f"{kind(sent.write)}+{kind(sent.then)}"] += 1
        elif isinstance(sent, ScriptCall) and sent.script.name != "claim_key":
            seen[sent.script.name] += 1
        elif not isinstance(sent, ScriptCall):
            seen[" ".join(str(c[0]) for c in sent.commands)] += 1
        reply = await call(sent)
        if isinstance(sent, ScriptCall) and sent.script.name == "claim_key":
            seen["claim_key (began)" if reply.begun else f"claim_key ({reply.state})"] += 1
        return reply

    async def commanding(*args: Any) -> Any:
        seen[str(args[0])] += 1
        return await command(*args)

    executor.call, executor.command = calling, commanding
    return seen


def test_an_answered_message_costs_three_round_trips(new_client: Callable[[], Any]) -> None:
    """Issue 16: what the worker sends per answered message, pinned: the key's claim
    (which begins the attempt), the words recorded with the context read, the answer
    recorded with its publish and the entry's finish. A key's later entries begin
    their attempt on their own (begin_attempt), not through a claim."""

    async def scenario() -> None:
        async with running(new_client) as run:
            warm = await run.send(99, "warm up")  # the layout published, the group made
            await run.answered(warm)
            seen = _calls_by_kind(run.store)
            # When five keys get one message each, and one more key two in a row
            ones = [await run.send(n, f"hello {n}") for n in range(1, 6)]
            twice = [await run.send(7, "first"), await run.send(7, "second")]
            await run.answered(*ones, *twice)
            # Then each message cost its two chained calls and one begin: by its key's
            # claim, or (key 7's second, its walk going on) by begin_attempt
            assert seen["record_turn+reads"] == 7
            assert seen["record_turn+publish_and_finish"] == 7
            assert seen["claim_key (began)"] + seen["begin_attempt"] == 7, seen
            assert seen["begin_attempt"] <= 1, seen
            # and nothing else but taking entries, waiting for them, and claims of a key
            # that another take had filed again meanwhile (found empty: no message's cost)
            overhead = {"take_inbound", "XREAD", "claim_key (empty)"}
            per_message = {k: v for k, v in seen.items() if k not in overhead}
            assert sum(per_message.values()) == 3 * 7, seen
            assert seen["claim_key (empty)"] <= 1, seen

    go(scenario())


class ForgettingChat(ScriptedChat):
    """An operator deletes the resident's IM session while the model is thinking about
    a message holding FORGET (before it answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: AsyncConversationStore | None = None

    async def complete(self, messages: list[Message]) -> str:
        if self.store is not None and "FORGET" in messages[-1]["content"]:
            assert await self.store.delete(avatar(1), "im")
        return await super().complete(messages)


def test_an_answer_goes_only_into_the_session_whose_context_it_answers(
    new_client: Callable[[], Any],
) -> None:
    """Issue 16: the model's answer was recorded with no check on the session, so one
    deleted (or expired, or evicted) during the model call took the answer into a new
    session: text made from the old session's context, in the new one. Now it is sent
    to the resident and stored nowhere; the next message starts clean."""
    chat = ForgettingChat()

    async def scenario() -> None:
        async with running(new_client, chat) as run:
            chat.store = run.store
            first = await run.send(1, "remember: my locker code is 4711")
            await run.answered(first)
            forget = await run.send(1, "FORGET all that")
            await run.answered(forget)
            # Then the resident got the answer, naming the session it answered
            assert run.replies[forget]["text"] == "ok: 2"
            assert run.replies[forget]["session_id"] == run.replies[first]["session_id"]
            # but no session holds it: the deleted one is gone, and none started with it
            assert await run.store.context(avatar(1), "im") == []
            assert run.worker.stats["replies_not_stored"] == 1
            later = await run.send(1, "hello again")
            await run.answered(later)
            context = await run.store.context(avatar(1), "im")
            assert [m.content for m in context] == ["hello again", "ok: 3"]
            assert run.replies[later]["session_id"] != run.replies[first]["session_id"]

    go(scenario())


# -- item 3: one huge message must not stall the other conversations ----------------------


class BlockingRedactor:
    """Wraps the store's redactor: redacting a huge text blocks (in whatever thread runs
    it) until the test releases it. On the event loop that would stall every key, so
    the test could never see the others answered, and the wait would time out."""

    def __init__(self, inner: Any, huge: int) -> None:
        self.inner, self.huge = inner, huge
        self.started, self.release = threading.Event(), threading.Event()
        self.released_in_time: bool | None = None
        self.on_loop: bool | None = None

    def redact(self, text: str) -> Any:
        if len(text) >= self.huge and not self.started.is_set():
            self.on_loop = _on_event_loop()
            self.started.set()
            self.released_in_time = self.release.wait(DEADLINE)
        return self.inner.redact(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_huge_hostile_message_does_not_stall_other_conversations(
    new_client: Callable[[], Any],
) -> None:
    """Regression (issue 12, item 3): redacting a 1 MiB match-dense message took ~0.4 s
    on the event loop, and every other conversation of the process waited for it."""
    hostile = "token: " * 149_000  # just under the 1 MiB input ceiling

    async def scenario() -> None:
        async with running(new_client) as run:
            prepare: Any = run.store._ops.prepare
            blocking = BlockingRedactor(prepare.redactor, len(hostile))
            prepare.redactor = blocking
            # Given a huge hostile message, then small ones of other residents
            huge = await run.send(1, hostile)
            loop = asyncio.get_running_loop()
            started = await loop.run_in_executor(None, blocking.started.wait, DEADLINE)
            assert started, "the huge message was never redacted"
            others = [await run.send(n, f"hello from {n}") for n in range(2, 6)]
            # When its redaction is still in progress, the others are answered
            await run.answered(*others)
            assert huge not in run.replies
            blocking.release.set()
            # Then it is answered too, after them
            await run.answered(huge)
            assert run.order.index(huge) > max(run.order.index(o) for o in others)
            assert blocking.released_in_time and blocking.on_loop is False

    go(scenario())


# -- second pass: a suspect runs alone ------------------------------------------------------


class OverlapChat(ScriptedChat):
    """Records, for the call whose text holds SUSPECT, which other calls were in flight
    at any moment of it. Ordinary calls linger (a bounded number of loop turns, no
    clock) so that anything allowed to run beside the suspect does."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: set[str] = set()
        self.beside_suspect: set[str] = set()

    async def complete(self, messages: list[Message]) -> str:
        last = [m["content"] for m in messages if m["role"] == "user"][-1]
        self.in_flight.add(last)
        try:
            for _ in range(100):
                if any("SUSPECT" in m for m in self.in_flight):
                    self.beside_suspect |= {m for m in self.in_flight if "SUSPECT" not in m}
                await asyncio.sleep(0)
            return await super().complete(messages)
        finally:
            self.in_flight.discard(last)


def test_an_entry_whose_earlier_attempt_died_runs_alone_in_its_worker(
    new_client: Callable[[], Any],
) -> None:
    """Regression (issue 12, second pass): entries in flight when a worker process dies
    each get an attempt counted, so a process-killing entry poisoned its bystanders.
    A suspect (an earlier attempt ended without a word) now runs with no other entry
    in flight in its process; the others wait (uncounted) and then go on concurrently.
    tests/test_worker_crash.py shows the outcome with real process deaths."""
    from gridmem.keys import KeySpace
    from gridmem.scripts import Scripts

    async def scenario() -> None:
        client = new_client()
        store = AsyncConversationStore(client, Settings().conversation, clock=ManualClock())
        await store.executor.call(Scripts().ensure_group(KeySpace().service(), group="workers"))
        # Given an entry whose worker died in an attempt at it, and other keys' entries
        fields = {"avatar_uuid": avatar(1), "channel": "im", "text": "a SUSPECT message"}
        suspect = (await client.xadd(INBOUND, fields)).decode()
        await store.executor.call(
            Scripts().take_inbound(KeySpace().service(), group="workers", consumer="x", count=9)
        )
        await _die_during_an_attempt(store, f"{avatar(1)}:im", "dead0", suspect, 0)
        await client.delete(f"{{gm:inbound}}:owner:{avatar(1)}:im")
        others = [
            (
                await client.xadd(
                    INBOUND, {"avatar_uuid": avatar(n), "channel": "im", "text": f"hi {n}"}
                )
            ).decode()
            for n in range(2, 8)
        ]
        await client.aclose()
        chat = OverlapChat()
        # When a worker (4 slots) answers them all
        async with running(new_client, chat, max_attempts=3) as run:
            await run.answered(suspect, *others)
            # Then nothing else was in flight while the suspect's model call ran
            assert chat.beside_suspect == set()
            assert len(run.replies) == 7 and await run.dead() == {}
            assert await run.client.hlen(ATTEMPTS) == 0

    go(scenario())


def test_the_gate_lets_ordinary_entries_run_together_and_a_suspect_alone() -> None:
    """The Gate itself: up to `slots` ordinary holders; a suspect waits for them to
    drain, holds back new ones, and runs with none beside it."""
    from worker.service import Gate

    async def scenario() -> None:
        gate = Gate(2)
        log: list[tuple[str, int, bool]] = []
        release = asyncio.Event()

        async def ordinary(name: str) -> None:
            async with gate.shared():
                log.append((name, *gate.busy))
                await release.wait()

        async def suspect() -> None:
            async with gate.alone():
                log.append(("suspect", *gate.busy))

        first = [asyncio.create_task(ordinary(n)) for n in ("a", "b")]
        await _until(lambda: gate.busy == (2, False))
        alone = asyncio.create_task(suspect())
        late = asyncio.create_task(ordinary("c"))  # arrives while the suspect waits
        await _until(lambda: gate.waiting == (1, 1))
        assert [entry[0] for entry in log] == ["a", "b"]  # the gate is full; both wait
        release.set()
        await asyncio.gather(*first, alone, late)
        assert log == [("a", 1, False), ("b", 2, False), ("suspect", 0, True), ("c", 1, False)]

    go(scenario())


async def _until(check: Callable[[], bool]) -> None:
    """Let the event loop run until `check` holds (tasks reaching their waits), with a
    bound: no time passes, only other tasks' steps."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)  # one step of the other tasks, not a wait for time
    raise AssertionError("never held")


def test_the_gate_reserves_a_slot_for_a_claim_as_it_gives_one_to_an_attempt() -> None:
    """Issue 16: a claim begins its first attempt in a slot reserved before it is sent
    (Gate.reserve): never beyond the slots, nor while a suspect waits or runs, so a
    suspect still runs with nothing beside it; a slot reserved and not used is given
    back (unreserve) to whoever waits."""
    from worker.service import Gate

    async def scenario() -> None:
        gate = Gate(2)
        await gate.reserve()
        await gate.reserve()
        third = asyncio.create_task(gate.reserve())
        await _until(lambda: gate.waiting == (1, 0))
        assert not third.done() and gate.busy == (2, False)  # full: it waits
        await gate.unreserve()  # a claim that began nothing gives its slot back
        await third
        assert gate.busy == (2, False)
        order: list[str] = []

        async def suspect() -> None:
            async with gate.alone():
                order.append("suspect")
                assert gate.busy == (0, True)

        async def claim() -> None:
            await gate.reserve()
            order.append("claim")
            await gate.unreserve()

        async with gate.shared(reserved=True):  # one reserved slot's attempt runs and ends
            pass
        assert gate.busy == (1, False)  # one slot held, one free
        alone = asyncio.create_task(suspect())  # waits for the held slot to drain
        await _until(lambda: gate.waiting == (0, 1))
        late = asyncio.create_task(claim())  # a slot is free, but a suspect waits: after it
        await _until(lambda: gate.waiting == (1, 1))
        assert order == []
        await gate.unreserve()
        await asyncio.gather(alone, late)
        assert order == ["suspect", "claim"] and gate.busy == (0, False)

    go(scenario())


class HeldChat(ScriptedChat):
    """A ScriptedChat whose calls wait until `release` is set; it counts the calls in
    flight and the most of them at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def complete(self, messages: list[Message]) -> str:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
            return await super().complete(messages)
        finally:
            self.in_flight -= 1


def test_concurrency_bounds_the_llm_calls_and_the_next_wave_waits_ready(
    new_client: Callable[[], Any],
) -> None:
    """Issue 16: `worker.concurrency` calls in flight, never more; meanwhile up to as
    many entries again are recorded with their contexts read, waiting only for a call,
    so a call that returns is replaced at once instead of after the next entry's
    Redis work (the Little's-law loss at C = 256: waves of calls)."""

    async def scenario() -> None:
        chat = HeldChat()
        async with running(new_client, chat, concurrency=3) as run:
            # Given 9 residents' messages, each its own key, while the model holds calls
            ids = [await run.send(who, f"hello {who}") for who in range(9)]

            async def recorded() -> int:
                found = 0
                for who in range(9):
                    found += bool(await run.store.context(avatar(who), "im"))
                return found

            async def six_ready() -> bool:
                return chat.in_flight >= 3 and await recorded() >= 6

            # Then 3 calls are out, 6 entries recorded (3 of them waiting for a call),
            # and the last 3 keys wait for an entry slot: nothing of theirs stored
            await run.until(six_ready, "six entries recorded")
            assert chat.in_flight == 3 and await recorded() == 6
            # When the model answers, every message is answered, 3 calls at most at once
            chat.release.set()
            await run.answered(*ids)
            assert chat.most_in_flight == 3 and len(chat.asked) == 9

    go(scenario())


def test_a_trickling_or_malformed_llm_answer_gives_the_failure_notice_and_the_key_goes_on(
    new_client: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12, second pass (LLM calls bounded, malformed bodies): a server that
    trickles its body is cut off at the call's deadline (one retry, then the notice);
    a 200 that is not a usable completion is the notice at once, never retried; none
    of the body reaches a log or the resident; the key's next message is answered."""
    from worker.llm import OFFLINE_LABEL
    from worker.llm import OpenAICompatible
    from worker.localllm import MARK
    from worker.localllm import LocalChatServer

    faults: list[int | str] = [
        "trickle", "trickle", "bad-json", "content-list", "no-choices", "content-null", "huge",
    ]  # fmt: skip
    with LocalChatServer(faults=faults, trickle_seconds=0.02) as server:
        llm = {"base_url": server.url, "timeout_seconds": 0.5, "max_retries": 1}
        chat = OpenAICompatible(Settings(llm={**llm, "retry_wait_seconds": 0.001}).llm)

        async def scenario() -> None:
            async with running(new_client, chat) as run:  # type: ignore[arg-type]
                # Given one resident's messages, answered in order, one fault each
                sent = [await run.send(1, f"message {n}") for n in range(7)]
                # When the worker has answered them all
                await run.answered(*sent)
                # Then each faulty answer became the failure notice, then the key went on
                texts = [run.replies[entry]["text"] for entry in sent]
                assert texts[:6] == [FAILURE_NOTICE] * 6
                assert texts[6].startswith(OFFLINE_LABEL) and "message 6" in texts[6]
                assert await run.dead() == {}
            await chat.aclose()

        caplog.set_level(logging.DEBUG, logger="gridmem")
        go(scenario())
        # And only the trickle was retried: 2 + 5 + 1 requests
        assert len(server.requests) == 8
    assert MARK not in caplog.text


def test_a_message_a_reader_sees_nothing_of_is_missing_text_and_never_stored(
    new_client: Callable[[], Any],
) -> None:
    """Issue 12, second pass: an inbound text of only invisible or format characters
    (ZWSP, word joiner, BOM, the tags block, bidi controls) or only control characters
    is dead-lettered `missing_text`: no empty turn is stored, the model is not asked,
    and the resident's next message is answered."""
    from tests.test_inbound import INVISIBLE_ONLY

    async def scenario() -> None:
        async with running(new_client) as run:
            blank = [await run.send(1, text) for text in INVISIBLE_ONLY]
            good = await run.send(1, "now something visible")
            await run.answered(good)
            await run.dead_lettered(*blank)
            assert await run.dead() == {e: {"id": e, "reason": "missing_text"} for e in blank}
            page = await run.store.read_page(avatar(1), "im", None, "forward", 50)
            assert page.turns[0].text == "now something visible"
            assert len(page.turns) == 2 and run.chat.asked == ["now something visible"]

    go(scenario())
