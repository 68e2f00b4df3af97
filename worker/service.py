"""One worker process: inbound stream -> store -> LLM -> store -> outbound stream.

Every worker reads the inbound stream through one consumer group. Reading files
each entry under its conversation key (avatar UUID, channel) in arrival order,
in the same atomic step (take_inbound.lua); a worker then takes a lease on a key
(claim_key.lua) and answers that key's entries one after another, oldest first,
while other keys are answered concurrently (up to `worker.concurrency` LLM calls
in flight). So one key's messages are never processed at the same time anywhere
and are answered in arrival order, however many processes or hosts run, as long as
each worker renews its lease in time: a worker stalled past `worker.lease_seconds`
loses the key, and its call still out may overlap the next owner's (the store
stays exactly-once either way).

Per entry: record the avatar's words (idempotency key = entry ID) and read the
context they leave, in one round trip (record_and_context), ask the LLM with the
configured system prompt, then record the visible reply (idempotency key = entry
ID + ":reply"; only into the session whose context it answers), publish it (as
stored: redacted) on the outbound stream, and acknowledge and delete the entry, in
one MULTI/EXEC on a single server (record_in_session_then). The entry's
`avatar_name` reaches the model only, as the `name` of the resident's message
(llm.display_name: redacted, sanitised); it is never stored. A crash anywhere
is safe: the lease runs out, another worker claims the key and redoes the entry;
the idempotency keys keep the store exactly-once, and a reply already recorded
is re-published rather than asked again (outbound is at-least-once; the bridge
can drop repeats by `in_reply_to`). Malformed entries go to the dead-letter
stream with a reason code, never their text; so do entries with a field that is
not valid UTF-8 (`bad_encoding`): every field is read as bytes and decoded here.
The reason is written to {gm:inbound}:rejected before the dead letter, so a
worker that dies in between leaves the decision to its adopter.

Round trips per answered message: three on a single server (issue 16): the claim
of the key, which also begins the attempt at its head (claim_key with `begin`,
once a slot of the Gate is reserved for it; begin_attempt for the key's later
entries, counted the same way), the words recorded with the context read, and
the reply recorded with its publish and the entry's finish. On a cluster the
session and the queue lie in other slots: the last is two (three with one
partition, whose outbound stream has a slot of its own).

Poison: every attempt at an entry is counted in Redis when it starts
(begin_attempt, or the claim that begins it), so the count survives lease
adoptions and worker restarts. An
entry an earlier attempt at which ended without a word (its worker died) is a
suspect and runs alone in this process (Gate): if it kills the process again,
no innocent entry was in flight, and entries waiting behind it were never begun.
An attempt that raises is retried at once
(the lease is still ours); after `worker.max_attempts` failed attempts, or when
the count shows that many attempts already ended without a word (their worker
died or stalled past its lease), the entry is dead-lettered as `poison` and the
key moves on to its next entry. Connection faults are not failures: the worker
waits for Redis and resumes the same attempt, uncounted. A model reply that
cannot be stored as given is cleaned, or replaced by the failure notice
(llm.clean_reply); it is never a reason to ask the model again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import secrets
import signal
import socket
import traceback
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any

from gridmem.clock import Clock
from gridmem.clock import make_clock
from gridmem.config import Settings
from gridmem.config import WorkerSettings
from gridmem.errors import InputTooLarge
from gridmem.errors import InvalidInput
from gridmem.errors import NoConsumerGroup
from gridmem.errors import StoreClosed
from gridmem.executor import RETRYABLE
from gridmem.executor import Unblocked
from gridmem.executor import slot_of
from gridmem.keys import KeySpace
from gridmem.keys import ServiceKeys
from gridmem.partitions import partition_of
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import ContextMessage
from gridmem.records import DeadLetterReason
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.scripts import AttemptCount
from gridmem.scripts import KeyStep
from gridmem.scripts import ScriptCall
from gridmem.store import OFFLOAD_TEXT_CHARS
from gridmem.store import AsyncConversationStore
from gridmem.store import async_client_for
from gridmem.stream_calls import OutboundReply
from worker import metrics
from worker.inbound import Rejected
from worker.inbound import check_inbound
from worker.inbound import decode_inbound
from worker.inbound import entry_ids
from worker.inbound import stream_order
from worker.llm import FAILURE_NOTICE
from worker.llm import ChatClient
from worker.llm import LlmUnavailable
from worker.llm import build_chat_client
from worker.llm import clean_reply
from worker.llm import context_budget
from worker.llm import display_name
from worker.llm import with_name

log = logging.getLogger("gridmem.worker")

GROUP = "workers"
TAKE_COUNT = 100  # inbound entries filed per take_inbound call
DEAD_MAX_ENTRIES = 10_000  # dead-letter stream, exact MAXLEN
OUTBOUND_MAX_ENTRIES = 100_000  # outbound stream, approximate MAXLEN
ORPHAN_SAMPLE = 100


@dataclass(frozen=True, slots=True)
class Key:
    """A conversation key (`<uuid>:<channel>`, its mailbox's member) in the partition
    whose keys file it. The nil UUID's key, where rejected entries are filed, is one
    per partition."""

    keys: ServiceKeys
    member: str


@dataclass(frozen=True, slots=True)
class _Answer:
    """What answering an entry gave: the reply to publish (None: the recorded reply is
    no longer in the transcript, nothing to publish), the outcome counted once it is
    out (the MESSAGES label: answered | failure_notice | republished) and, for a new
    answer, the text to record (recorded with the entry's finish; None when a reply
    recorded earlier is published again)."""

    reply: OutboundReply | None
    outcome: str
    record: str | None = None


@dataclass
class _Hand:
    """The token of the attempt a worker has in hand at an entry ('' if none), and the
    key's next step once an attempt answered the entry and finished it (None: the
    entry is still to be finished, without a reply: it was dead-lettered)."""

    token: str
    finished: KeyStep | None = None


class Gate:
    """Who may run an entry in this process: up to `slots` ordinary entries at once
    (the Worker's 2 x concurrency: its LLM calls are bounded apart), or one suspect
    alone.

    A suspect (an entry an earlier attempt at which ended without a word) may kill
    its process again; running it alone means no innocent entry is in flight when it
    does, so crashes are charged to the culprit only. A waiting suspect holds back new
    ordinary entries (else a steady flow of them would starve it) while those in
    flight finish.
    """

    def __init__(self, slots: int) -> None:
        self._slots = slots
        self._running = 0
        self._alone = False
        self._waiting_alone = 0
        self._waiting_shared = 0
        self._changed = asyncio.Condition()

    async def reserve(self) -> None:
        """Wait for an ordinary slot and take it (as `shared` does), for an attempt the
        caller begins in the same round trip as its claim: it then runs the attempt in
        `shared(reserved=True)`, or gives the slot back (`unreserve`)."""
        async with self._changed:
            self._waiting_shared += 1
            try:
                await self._changed.wait_for(self._free)
            finally:
                self._waiting_shared -= 1
            self._running += 1

    async def unreserve(self) -> None:
        async with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def _free(self) -> bool:
        return not self._alone and not self._waiting_alone and self._running < self._slots

    @contextlib.asynccontextmanager
    async def shared(self, *, reserved: bool = False) -> AsyncIterator[None]:
        """An ordinary slot for the block (one taken by `reserve`, with reserved=True)."""
        if not reserved:
            await self.reserve()
        try:
            yield
        finally:
            await self.unreserve()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._changed:
            self._waiting_alone += 1
            try:
                await self._changed.wait_for(lambda: not self._alone and self._running == 0)
            finally:
                self._waiting_alone -= 1
                self._changed.notify_all()
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()

    @property
    def busy(self) -> tuple[int, bool]:
        """(ordinary entries running, whether a suspect runs alone): for tests."""
        return self._running, self._alone

    @property
    def waiting(self) -> tuple[int, int]:
        """(ordinary entries waiting for a slot, suspects waiting): for tests."""
        return self._waiting_shared, self._waiting_alone


def settings_clock(settings: WorkerSettings) -> Clock:
    return make_clock(settings.clock_speed, settings.clock_origin_ms)


def worker_name() -> str:
    raw = f"{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.:\-]", "_", raw)[:100]


def describe(exc: BaseException) -> str:
    """An exception as its type and the line that raised it, never its message:
    messages may quote what a resident said (pydantic's do)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {Path(last.filename).name}:{last.lineno} in {last.name}"


class Worker:
    """Answers inbound entries until stop() is called; then finishes what it holds."""

    def __init__(
        self,
        store: AsyncConversationStore,
        chat: ChatClient,
        settings: Settings,
        name: str | None = None,
    ) -> None:
        self.store = store
        self.chat = chat
        self.settings = settings
        self.budget = context_budget(settings.llm)  # [llm] context_tokens, reply_tokens
        self.name = name or worker_name()
        conversation = settings.conversation
        space = KeySpace(conversation.namespace, conversation.shards, conversation.partitions)
        self.partitions = space.services()
        # Where the outbound stream shares the inbound stream's slot (every partitioned
        # layout; any layout on one server), finish_entry publishes the reply itself.
        self._publish_in_finish = {
            keys.partition: store.executor.cluster is None
            or slot_of(keys.outbound) == slot_of(keys.inbound)
            for keys in self.partitions
        }
        self.scripts = store.scripts
        self.lease_ms = int(settings.worker.lease_seconds * 1000)
        self.max_attempts = settings.worker.max_attempts
        self.stats: Counter[str] = Counter()
        self._stopping = asyncio.Event()
        # `concurrency` LLM calls in flight, and twice as many entries in hand: while
        # a wave of calls is out, the next wave's entries are recorded and their
        # contexts read, so a call that returns frees its place to one ready to go at
        # once. (A gate of `concurrency` entries held each slot through the entry's
        # Redis work too: the replies of a wave came back as waves of new calls spread
        # over the event loop's work, 0.68-0.82 of C / L at C = 256; issue 16.)
        self._calls = asyncio.Semaphore(settings.worker.concurrency)
        self._gate = Gate(2 * settings.worker.concurrency)
        self._active: dict[Key, asyncio.Task[None]] = {}
        self._recheck: set[Key] = set()
        # Keys this worker may hold at once: enough to keep every entry slot busy, few
        # enough that a burst spreads over all workers instead of one taking it all.
        self._max_keys = 2 * settings.worker.concurrency
        self._key_done = asyncio.Event()
        # one take at a time, so the partitions' readers share the room for keys
        self._taking = asyncio.Lock()
        # Attempt tokens: random per Worker, so a restarted process (same name, same
        # pid in a container) never passes for the one that died.
        self._token_prefix = secrets.token_hex(6)
        self._token_numbers = itertools.count(1)

    def stop(self) -> None:
        """Stop taking work; entries in hand are finished and their keys released."""
        self._stopping.set()

    async def run(self) -> None:
        """One reader per partition (each waits on its own stream, so an idle partition
        holds up no other), one orphan adopter for all; until stop()."""
        for keys in self.partitions:
            await self.store.executor.call(self.scripts.ensure_group(keys, group=GROUP))
        orphans = asyncio.create_task(self._adopt_orphans())
        readers = [asyncio.create_task(self._read(keys)) for keys in self.partitions]
        try:
            await asyncio.gather(*readers)
        finally:
            for task in (orphans, *readers):
                task.cancel()
            await asyncio.gather(orphans, *readers, return_exceptions=True)
            if self._active:
                await asyncio.gather(*self._active.values(), return_exceptions=True)

    # -- taking work ------------------------------------------------------------------

    async def _read(self, keys: ServiceKeys) -> None:
        """Take one partition's new entries while there is room for more keys; when it
        has none, block on its stream (not on the others': a blocking read of several
        streams is a cross-slot command on a cluster)."""
        last_seen = "0-0"
        while not self._stopping.is_set():
            room = self._max_keys - len(self._active)
            if room <= 0:
                self._key_done.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._key_done.wait(), 1.0)
                continue
            try:
                async with self._taking:
                    room = self._max_keys - len(self._active)
                    taken = await self._take(keys, min(TAKE_COUNT, room)) if room > 0 else ""
                if taken:
                    last_seen = max(last_seen, taken, key=stream_order)
                elif room > 0:
                    last_seen = await self._wait_for_inbound(keys, last_seen)
            except RETRYABLE:
                log.warning("redis unreachable; retrying")
                await self._pause(1.0)

    async def _take(self, keys: ServiceKeys, count: int) -> str:
        """File up to `count` new entries of one partition; the newest one's ID, or ''."""
        call = self.scripts.take_inbound(keys, group=GROUP, consumer=self.name, count=count)
        try:
            taken = await self.store.executor.call(call)
        except NoConsumerGroup:
            # the server lost its data (restarted without persistence): start over
            await self.store.executor.call(self.scripts.ensure_group(keys, group=GROUP))
            return ""
        for entry in taken:
            # an entry without a valid key comes filed under REJECTED_MEMBER, its reason
            # recorded: that key's walk dead-letters it, crash-safe like any other
            self._start(Key(keys, entry.member))
        return max((entry.entry_id for entry in taken), key=stream_order, default="")

    async def _wait_for_inbound(self, keys: ServiceKeys, last_seen: str) -> str:
        """Block (up to a second) until the partition's stream has entries past the
        last one seen, or until stop(): a stopping worker does not sit out the read.
        The newest entry ID seen."""
        read = asyncio.ensure_future(
            self.store.executor.command(
                "XREAD", "COUNT", 100, "BLOCK", 1000, "STREAMS", keys.inbound, last_seen
            )
        )
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({read, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not read.done():
                read.cancel()  # redis-py drops that connection: its reply is never read
                with contextlib.suppress(asyncio.CancelledError, *RETRYABLE):
                    await read
        if read.cancelled():
            return last_seen
        try:
            found: Any = read.result()
        except Unblocked:  # a failover: the partition's new primary is asked next time
            return last_seen
        return max([last_seen, *entry_ids(found)], key=stream_order)

    async def _adopt_orphans(self) -> None:
        """Keys whose worker died (lease expired) are picked up here, in every partition."""
        interval = max(0.5, self.settings.worker.lease_seconds / 3)
        while not self._stopping.is_set():
            for keys in self.partitions:
                with contextlib.suppress(*RETRYABLE):
                    call = self.scripts.orphaned_keys(keys, sample=ORPHAN_SAMPLE)
                    for member in await self.store.executor.call(call):
                        self._start(Key(keys, member))
            await self._pause(interval)

    async def _pause(self, seconds: float) -> None:
        """Wait, but wake at once on stop()."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # -- one key at a time ----------------------------------------------------------------

    def _start(self, key: Key) -> None:
        if self._stopping.is_set():
            return
        if key in self._active:
            self._recheck.add(key)  # its task may be just releasing the key
            return
        self._active[key] = asyncio.create_task(self._answer_key(key))

    async def _answer_key(self, key: Key) -> None:
        try:
            await self._walk(key)
        except RETRYABLE:
            log.warning("redis unreachable while taking a key; its lease will expire")
        except Exception as exc:  # a bug of ours, not of the entry: the lease will expire
            log.error("unexpected %s while answering a key", describe(exc))
        finally:
            del self._active[key]
            self._key_done.set()
            if key in self._recheck:
                self._recheck.discard(key)
                self._start(key)

    def _token(self) -> str:
        """A new name for one attempt at an entry (see begin_attempt.lua)."""
        return f"{self._token_prefix}.{next(self._token_numbers)}"

    async def _walk(self, key: Key) -> None:
        """Claim the key once a slot of the gate is free, then answer its entries oldest
        first until it is empty.

        The claim also begins the first attempt (one round trip instead of two) in
        that slot; the slot is given back if the claim began none (another worker
        owns the key, nothing waits, or the head is a suspect, a rejected entry or
        out of attempts: _step handles those as any head)."""
        await self._gate.reserve()
        token, resume = self._token(), ""
        try:
            step = await self._claim(key, begin=token)
        except BaseException as exc:
            await self._gate.unreserve()
            if not isinstance(exc, RETRYABLE):
                raise
            # The claim may have gone through: claim again once Redis answers; an
            # attempt it began is in hand, and goes on under a new name, uncounted.
            step, resume = await self._resume(key, token), token
        else:
            if step.begun is not None:
                step = replace(step, begun_token=token)
            else:
                await self._gate.unreserve()
        renewer = asyncio.create_task(self._renew(key))
        try:
            while step.state == "ok":
                step, resume = await self._step(key, step, resume)
        finally:
            renewer.cancel()  # and awaited: a renewal still out must not outlive the store
            with contextlib.suppress(asyncio.CancelledError, *RETRYABLE, StoreClosed):
                await renewer

    async def _step(self, key: Key, step: KeyStep, resume: str) -> tuple[KeyStep, str]:
        """Settle the key's head entry, then hand over the next one.

        `resume` names this worker's attempt in hand when a connection fault cut it
        short ('' otherwise): it goes on under a new name, uncounted. Returns the next
        step and, after a connection fault, the token of the attempt in hand.
        """
        entry_id, hand = step.entry_id, _Hand(resume)
        try:
            if step.rejected:  # a worker decided this before it died: its reason stands
                await self._dead_letter(entry_id, step.rejected, key=key)
            elif step.attempts >= self.max_attempts:
                # the earlier attempts ended without a word: their worker died or stalled
                await self._dead_letter(entry_id, DeadLetterReason.POISON, key=key)
            elif not await self._settle(key, step, hand):
                return KeyStep("lost"), ""
            return hand.finished or await self._finish(entry_id, key, None), ""
        except RETRYABLE:
            log.warning("redis unreachable during entry %s; resuming it when it answers", entry_id)
            return await self._resume(key, hand.token), hand.token

    async def _settle(self, key: Key, step: KeyStep, hand: _Hand) -> bool:
        """Attempts at one entry until one answers it or it is dead-lettered poison.

        A suspect (an earlier attempt ended without a word: it may kill its process)
        runs alone in this process, so no innocent entry is in flight when it does.
        Each attempt is counted (begin_attempt) once the gate lets it run. False if
        the key passed to another worker meanwhile.
        """
        entry_id, failed, suspect = step.entry_id, "", step.silent > 0
        begun = step.begun  # counted by the claim, its gate slot reserved
        while True:
            if begun is not None:
                gate = self._gate.shared(reserved=True)
            else:
                gate = self._gate.alone() if suspect else self._gate.shared()
            async with gate:
                if begun is not None:
                    token, count, begun = step.begun_token, begun, None
                else:
                    token = self._token()
                    count = await self._begin(key, entry_id, token, hand.token, failed)
                if count.state != "ok":
                    return False
                hand.token = token
                if count.attempts > self.max_attempts:
                    answered = False  # counted meanwhile by workers that died: do not run it
                elif count.silent > 0 and not suspect:
                    # it became one since the claim: run it alone instead, this attempt
                    # resumed uncounted (`hand` names it) once the gate is ours alone
                    suspect, failed = True, ""
                    continue
                else:
                    answered = await self._attempt(key, entry_id, count, hand)
            if answered:
                return True
            if count.attempts >= self.max_attempts:
                await self._dead_letter(entry_id, DeadLetterReason.POISON, key=key)
                return True
            failed, hand.token = token, ""

    async def _attempt(self, key: Key, entry_id: str, count: AttemptCount, hand: _Hand) -> bool:
        """Answer one entry, and finish it with its reply published (the key's next step
        left in `hand`). False if that failed: publishing is part of the attempt, so a
        reply that cannot be published counts as a failed attempt (connection faults
        propagate)."""
        try:
            answer = await self._answer_entry(key, entry_id, count.fields)
            if answer is not None:
                if answer.record is not None and answer.reply is not None:
                    hand.finished, answer = await self._record_and_finish(entry_id, key, answer)
                elif answer.reply is not None:
                    hand.finished = await self._finish(entry_id, key, answer.reply)
                # counted once the reply is out: a failed publish is no answer
                self.stats["republished" if answer.outcome == "republished" else "answered"] += 1
                metrics.MESSAGES.labels(answer.outcome).inc()
        except RETRYABLE:
            raise
        except Exception as exc:
            self.stats["failed_attempts"] += 1
            metrics.MESSAGES.labels("failed_attempt").inc()
            log.warning(
                "entry %s: attempt %d of %d failed: %s",
                entry_id,
                count.attempts,
                self.max_attempts,
                describe(exc),
            )
            return False
        return True

    async def _claim(self, key: Key, also: str = "", begin: str = "") -> KeyStep:
        return await self.store.executor.call(
            self.scripts.claim_key(
                key.keys,
                member=key.member,
                owner=self.name,
                lease_ms=self.lease_ms,
                also=also,
                begin=begin,
                max_attempts=self.max_attempts,
            )
        )

    async def _begin(
        self, key: Key, entry_id: str, token: str, also: str, failed: str
    ) -> AttemptCount:
        count: AttemptCount = await self.store.executor.call(
            self.scripts.begin_attempt(
                key.keys,
                member=key.member,
                owner=self.name,
                entry_id=entry_id,
                token=token,
                also=also,
                failed=failed,
            )
        )
        return count

    async def _resume(self, key: Key, earlier: str) -> KeyStep:
        """After a connection fault: once Redis answers, claim the key again.

        The claim names the attempt in hand (`earlier`), which has not ended, so the
        fault never counts as an attempt nor makes the entry a suspect; if the lease
        ran out and another worker took the key meanwhile, the claim says busy and
        that worker goes on.
        """
        delay = 0.25
        while not self._stopping.is_set():
            await self._pause(delay)
            try:
                return await self._claim(key, also=earlier)
            except RETRYABLE:
                delay = min(2 * delay, 5.0)
        return KeyStep("stopped")  # the lease runs out; another worker takes the key

    async def _renew(self, key: Key) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            with contextlib.suppress(*RETRYABLE):
                await self.store.executor.call(
                    self.scripts.renew_lease(
                        key.keys, member=key.member, owner=self.name, lease_ms=self.lease_ms
                    )
                )

    async def _finish(self, entry_id: str, key: Key, reply: OutboundReply | None) -> KeyStep:
        """Publish the entry's reply (if any), then acknowledge and delete the entry: one
        step where the outbound stream shares the inbound stream's slot, else two."""
        if reply is not None and not self._publish_in_finish[key.keys.partition]:
            await self._publish(key, reply)
            reply = None
        return await self.store.executor.call(self._finish_call(entry_id, key, reply))

    def _finish_call(
        self, entry_id: str, key: Key, reply: OutboundReply | None
    ) -> ScriptCall[KeyStep]:
        """finish_entry's call, publishing `reply` in the same step (publish_and_finish)."""
        return self.scripts.finish_entry(
            key.keys,
            group=GROUP,
            entry_id=entry_id,
            member=key.member,
            owner=self.name,
            lease_ms=self.lease_ms,
            release=self._stopping.is_set(),
            reply=reply,
            max_replies=OUTBOUND_MAX_ENTRIES,
        )

    async def _record_and_finish(
        self, entry_id: str, key: Key, answer: _Answer
    ) -> tuple[KeyStep, _Answer]:
        """Record a new answer, publish it and finish the entry (_store_answer); if the
        store refuses the answer after all (a rule _usable could not foresee), the
        failure notice instead. The key's next step, and the answer as sent."""
        assert answer.reply is not None and answer.record is not None
        try:
            return await self._store_answer(entry_id, key, answer.reply, answer.record), answer
        except InvalidInput:  # refused before anything was sent
            self.stats["unusable_replies"] += 1
            metrics.LLM_ERRORS.labels("unusable").inc()
        stored = await self.store.stored_text(FAILURE_NOTICE)
        notice = _Answer(replace(answer.reply, text=stored), "failure_notice", FAILURE_NOTICE)
        return await self._store_answer(entry_id, key, notice.reply, FAILURE_NOTICE), notice

    async def _store_answer(
        self, entry_id: str, key: Key, reply: OutboundReply | None, text: str
    ) -> KeyStep:
        """Record a new answer into the session whose context it answers, then publish
        it and finish the entry: one MULTI/EXEC on a single server (the store's
        record_in_session_then); on a cluster the session and the queue lie in other
        slots, and the record goes first. A session that ended while the model was
        thinking (deleted, expired, evicted) does not take the answer, and no new
        session starts with it: the resident still gets it."""
        assert reply is not None
        record = AgentReply(text=text)
        with metrics.RECORD_SECONDS.time():
            if self._publish_in_finish[key.keys.partition]:
                receipt, step = await self.store.record_in_session_then(
                    reply.avatar_uuid,
                    reply.channel,
                    record,
                    reply.session_id,
                    f"{entry_id}:reply",
                    then=self._finish_call(entry_id, key, reply),
                )
            else:
                receipt = await self.store.record_in_session(
                    reply.avatar_uuid, reply.channel, record, reply.session_id, f"{entry_id}:reply"
                )
                step = await self._finish(entry_id, key, reply)
        if receipt is None:
            self.stats["replies_not_stored"] += 1
            log.info("entry %s: its session ended before the answer; sent, not stored", entry_id)
        else:
            metrics.RECORDS.labels("agent_reply").inc()
        return step

    async def _reject(self, entry_id: str, reason: str, *, key: Key) -> None:
        """Dead-letter an entry of a key this worker holds, the decision written first.

        The dead-letter stream is in another cluster slot than the key's mailbox, so
        the two cannot change in one step. The reason goes to {gm:inbound}:rejected
        before the dead letter; if this worker dies in between (or before
        finish_entry), the next claim shows the reason and the adopter dead-letters
        the entry with it: not answered, not lost, not retried as poison.
        finish_entry deletes the record with the entry.
        """
        await self.store.executor.command("HSET", key.keys.rejected, entry_id, reason)
        await self._dead_letter(entry_id, reason, key=key)

    async def _dead_letter(self, entry_id: str, reason: str, *, key: Key) -> None:
        """Record the rejection on gm:dead; the caller then finishes the entry."""
        await self.store.executor.call(
            self.scripts.dead_letter(
                key.keys, entry_id=entry_id, reason=reason, max_entries=DEAD_MAX_ENTRIES
            )
        )
        self.stats["dead_lettered"] += 1
        self.stats[f"dead_lettered:{reason}"] += 1
        metrics.MESSAGES.labels("dead_lettered").inc()
        log.info("entry %s dead-lettered: %s", entry_id, reason)

    # -- one entry ---------------------------------------------------------------------------

    async def _answer_entry(
        self, key: Key, entry_id: str, raw: tuple[tuple[bytes, bytes], ...]
    ) -> _Answer | None:
        """Answer one entry, its fields as begin_attempt read them (undecoded): the reply
        to publish, or None (the entry was dead-lettered)."""
        limits = self.settings.conversation.limits
        try:
            fields = decode_inbound(raw, limits.max_input_bytes)
            uuid, channel, text = check_inbound(fields, limits.max_input_bytes)
            if partition_of(uuid, len(self.partitions)) != key.keys.partition:
                # answered here, its key could be answered in two partitions at once
                raise Rejected(DeadLetterReason.WRONG_PARTITION)
            # the words and the context the model then gets: one round trip
            with metrics.CONTEXT_SECONDS.time():
                recorded, context = await self.store.record_and_context(
                    uuid,
                    channel,
                    AvatarMessage(text=text),
                    entry_id,
                    max_tokens=self.budget.max_tokens,
                    count_tokens=self.budget.count_tokens,
                )
        except Rejected as bad:
            await self._reject(entry_id, bad.reason, key=key)
            return None
        except InputTooLarge:
            await self._reject(entry_id, DeadLetterReason.OVERSIZED, key=key)
            return None
        except InvalidInput:
            await self._reject(entry_id, DeadLetterReason.BAD_TEXT, key=key)
            return None
        reply_key = f"{entry_id}:reply"
        if recorded.duplicate:
            found, again = await self._republish(uuid, channel, entry_id, reply_key)
            if found:
                return _Answer(again, "republished")
        else:
            metrics.RECORDS.labels("avatar_message").inc()
        reply = await self._ask(context, await _display_name(fields.get("avatar_name")))
        text_, stored = await self._usable(reply)
        outcome = "failure_notice" if text_ == FAILURE_NOTICE else "answered"
        # the session the words went into: the answer goes there, or nowhere
        out = OutboundReply(uuid, channel, stored, entry_id, recorded.session_id)
        return _Answer(out, outcome, text_)

    async def _usable(self, reply: str) -> tuple[str, str]:
        """The model's reply as it will be recorded (cleaned) and as the store keeps it
        (redacted, bounded); the failure notice if none of it can be stored."""
        cleaned = clean_reply(reply, self.settings.conversation.limits.max_input_bytes)
        if cleaned is not None:
            try:
                return cleaned, await self.store.stored_text(cleaned)
            except InvalidInput:  # the store would refuse even the cleaned reply
                pass
        self.stats["unusable_replies"] += 1
        metrics.LLM_ERRORS.labels("unusable").inc()
        return FAILURE_NOTICE, await self.store.stored_text(FAILURE_NOTICE)

    async def _ask(self, context: list[ContextMessage], name: str | None) -> str:
        """The model's answer to the key's context, `name` (the resident's display
        name, redacted and sanitised) on their newest message."""
        messages = [{"role": "system", "content": self.settings.llm.system_prompt}]
        messages = with_name(messages + [m.to_openai() for m in context], name)
        try:
            async with self._calls:
                with metrics.LLM_SECONDS.time():
                    return await self.chat.complete(messages)
        except LlmUnavailable as exc:
            self.stats["llm_failures"] += 1
            metrics.LLM_ERRORS.labels("unavailable").inc()
            log.warning("LLM unavailable (%s); answering with a failure notice", exc)
            return FAILURE_NOTICE

    async def _republish(
        self, uuid: str, channel: str, entry_id: str, reply_key: str
    ) -> tuple[bool, OutboundReply | None]:
        """A redelivered entry whose reply was recorded: that reply, to publish once more.
        (False, None) if only the words were recorded (answer now); (True, None) if the
        recorded reply is no longer in the transcript (nothing to publish)."""
        receipt = await self.store.receipt(uuid, channel, reply_key)
        if receipt is None:
            return False, None
        page = await self.store.read_page(uuid, channel, receipt.seq - 1, "forward", 1)
        if page.turns and page.turns[0].seq == receipt.seq:
            text_ = page.turns[0].text
            return True, OutboundReply(uuid, channel, text_, entry_id, receipt.session_id)
        return True, None

    async def _publish(self, key: Key, reply: OutboundReply) -> None:
        """A reply on the outbound stream of the entry's partition (the avatar's)."""
        await self.store.executor.call(
            self.scripts.publish_reply(key.keys, reply, max_entries=OUTBOUND_MAX_ENTRIES)
        )


async def _display_name(raw: str | None) -> str | None:
    """The entry's avatar_name as the model will see it (llm.display_name), or None.

    Never stored, logged or published: it reaches the model only. A long one is
    redacted in a thread, as a long text is, so it does not stall the event loop.
    """
    if not raw:
        return None
    if len(raw) > OFFLOAD_TEXT_CHARS:
        return await asyncio.to_thread(display_name, raw, DEFAULT_REDACTOR)
    return display_name(raw, DEFAULT_REDACTOR)


def run_worker_process(settings_data: dict[str, Any], url: str) -> None:
    """Entry point of one worker process (spawned by the supervisor)."""
    settings = Settings.model_validate(settings_data)
    logging.basicConfig(
        level=settings.worker.log_level,
        format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(message)s",
    )
    asyncio.run(_serve(settings, url))


def redis_connections(settings: Settings) -> int:
    """The worker's Redis pool: one connection per partition reader (a blocking
    read holds its connection), and for the entries a quarter of the concurrency:
    a call holds its connection until the event loop gets back to it, which under
    CPU load is long (C / 16 made callers wait past the pool's 20 s at C = 1,024 in
    bench/service.py), while the server's listen backlog (511) caps a connect burst
    (issue 16)."""
    return settings.conversation.partitions + 16 + settings.worker.concurrency // 4


async def _serve(settings: Settings, url: str) -> None:
    store = AsyncConversationStore(
        async_client_for(settings.redis, url, max_connections=redis_connections(settings)),
        settings.conversation,
        clock=settings_clock(settings.worker),
        durability=settings.redis.durability,
    )
    # Twice the calls in flight: with exactly `concurrency` connections, calls waited
    # for one (test_llm_requests_hold_only_their_own_key saw deadlines and retries;
    # a call cut off by its deadline holds its connection until it is closed).
    chat = build_chat_client(settings.llm, connections=2 * settings.worker.concurrency)
    worker = Worker(store, chat, settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # HUP: the terminal closed
        loop.add_signal_handler(sig, worker.stop)
    log.info("worker %s started (%s)", worker.name, chat.name)
    try:
        await worker.run()
    finally:
        # Stopped: a late signal (the supervisor's SIGTERM after the terminal's SIGINT)
        # is ignored from here on. Left to asyncio, one landing while the loop closes
        # wrote to its closed wakeup fd ("Exception ignored ... Bad file descriptor" on
        # Ctrl-C). The supervisor's immediate stop is SIGKILL, which no handler sees.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
        await chat.aclose()
        await store.aclose()
        log.info("worker %s stopped: %s", worker.name, dict(worker.stats))
