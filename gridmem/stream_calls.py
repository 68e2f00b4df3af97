"""The worker service's stream calls: the inbound queue, its per-conversation
mailboxes and leases, the dead-letter and outbound streams. Each returns a call
(gridmem/replies.py) and talks to no server: a `ScriptCall` where a step must be
atomic across keys (Lua), a `CommandCall` where one command is the whole step,
its arguments checked here first (gridmem/arguments.py), as a script would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gridmem.arguments import CANONICAL_UUID
from gridmem.arguments import CHANNELS
from gridmem.arguments import ENTRY_ID
from gridmem.arguments import NAME
from gridmem.arguments import SESSION_ID_RE
from gridmem.arguments import integer
from gridmem.arguments import matching
from gridmem.arguments import one_of
from gridmem.keys import ServiceKeys
from gridmem.records import DeadLetterReason
from gridmem.replies import AttemptCount
from gridmem.replies import CommandCall
from gridmem.replies import KeyStep
from gridmem.replies import ScriptCall
from gridmem.replies import ScriptCalls
from gridmem.replies import TakenEntry
from gridmem.replies import _parse_attempt
from gridmem.replies import _parse_step
from gridmem.replies import _parse_taken
from gridmem.replies import _parse_texts
from gridmem.replies import text

DEAD_LETTER_REASONS = frozenset(code.value for code in DeadLetterReason)


@dataclass(frozen=True, slots=True)
class OutboundReply:
    """The agent's visible reply (already redacted and bounded, as stored) to one
    inbound entry, as the bridge reads it from the outbound stream."""

    avatar_uuid: str
    channel: str
    text: str
    in_reply_to: str
    session_id: str

    def fields(self) -> tuple[str, ...]:
        """field, value, ... in the stream contract's order, each argument checked."""
        return (
            "avatar_uuid", matching("avatar_uuid", self.avatar_uuid, CANONICAL_UUID),
            "channel", one_of("channel", self.channel, CHANNELS),
            "text", self.text,
            "in_reply_to", matching("in_reply_to", self.in_reply_to, ENTRY_ID),
            "session_id", matching("session_id", self.session_id, SESSION_ID_RE),
        )  # fmt: skip


def _created(reply: Any) -> bool:
    """XGROUP CREATE's reply: OK (created), or the BUSYGROUP error (it existed)."""
    return not isinstance(reply, Exception)


class StreamCalls(ScriptCalls):
    """One typed method per service stream operation. Holds the scripts' sources; never a
    connection."""

    def ensure_group(self, service: ServiceKeys, *, group: str) -> CommandCall[bool]:
        """Create the workers' consumer group on the inbound stream (and the stream)
        if it is missing; True if this call created it. A new group starts at the
        stream's beginning: handled entries are deleted as they are finished, so what
        is left there is still to be answered. Safe to resend: a group created by the
        first send makes the second say it existed."""
        name = matching("group", group, NAME)
        command = ("XGROUP", "CREATE", service.inbound, name, "0", "MKSTREAM")
        return CommandCall((command,), _created, answers="BUSYGROUP")

    def take_inbound(
        self, service: ServiceKeys, *, group: str, consumer: str, count: int
    ) -> ScriptCall[list[TakenEntry]]:
        return self._call(
            "take_inbound",
            (service.inbound, service.ready, service.rejected),
            (group, consumer, count),
            _parse_taken,
            # a resend would read further entries; the first batch is filed anyway
            idempotent=False,
        )

    def claim_key(
        self,
        service: ServiceKeys,
        *,
        member: str,
        owner: str,
        lease_ms: int,
        also: str = "",
        begin: str = "",
        max_attempts: int = 1,
    ) -> ScriptCall[KeyStep]:
        """With `begin` (a token), also begin an attempt at an ordinary head (fewer than
        `max_attempts` ended, none silent, none rejected): KeyStep.begun. Safe to
        resend: a repeated token counts its attempt once."""
        return self._call(
            "claim_key",
            (service.ready, service.attempts, service.rejected, service.inbound),
            (member, owner, lease_ms, also, begin, max_attempts),
            _parse_step,
        )

    def begin_attempt(
        self,
        service: ServiceKeys,
        *,
        member: str,
        owner: str,
        entry_id: str,
        token: str,
        also: str = "",
        failed: str = "",
    ) -> ScriptCall[AttemptCount]:
        """Count the attempt and read the entry (AttemptCount.fields) in one step. Safe to
        resend: the token makes a repeated call count its attempt once."""
        return self._call(
            "begin_attempt",
            (service.ready, service.attempts, service.inbound),
            (member, owner, entry_id, token, also, failed),
            _parse_attempt,
        )

    def finish_entry(
        self,
        service: ServiceKeys,
        *,
        group: str,
        entry_id: str,
        member: str,
        owner: str,
        lease_ms: int,
        release: bool,
        reply: OutboundReply | None = None,
        max_replies: int = 1,
    ) -> ScriptCall[KeyStep]:
        """With a reply, publish it on the outbound stream (approximate MAXLEN of
        `max_replies`) in the same step (publish_and_finish.lua): one round trip, and
        no entry finished without its reply. The outbound stream must then be in the
        inbound stream's cluster slot (every partitioned layout; one partition on one
        server). Without a reply, safe to resend."""
        keys = (service.inbound, service.ready, service.attempts, service.rejected)
        args: tuple[Any, ...] = (group, entry_id, member, owner, lease_ms, int(release))
        if reply is None:
            return self._call("finish_entry", keys, args, _parse_step)
        most = integer("max_replies", max_replies, 1)
        return self._call(
            "publish_and_finish",
            (*keys, service.outbound),
            (*args, most, *reply.fields()),
            _parse_step,
            idempotent=False,  # a resend would publish the reply twice
        )

    def renew_lease(
        self, service: ServiceKeys, *, member: str, owner: str, lease_ms: int
    ) -> ScriptCall[bool]:
        return self._call("renew_lease", (service.ready,), (member, owner, lease_ms), bool)

    def orphaned_keys(self, service: ServiceKeys, *, sample: int) -> ScriptCall[list[str]]:
        return self._call("orphaned_keys", (service.ready,), (sample,), _parse_texts)

    def read_backlog(self, service: ServiceKeys) -> ScriptCall[int]:
        return self._call("read_backlog", (service.inbound,), (), int)

    def dead_letter(
        self, service: ServiceKeys, *, entry_id: str, reason: str, max_entries: int
    ) -> CommandCall[str]:
        """Record that an inbound entry was rejected, and why (a DeadLetterReason), never
        its text; the stream keeps `max_entries` (exact MAXLEN). The new entry's ID."""
        entry = matching("entry_id", entry_id, ENTRY_ID)
        code = one_of("reason", reason, DEAD_LETTER_REASONS)
        most = integer("max_entries", max_entries, 1)
        command = ("XADD", service.dead, "MAXLEN", most, "*", "id", entry, "reason", code)
        return CommandCall((command,), text, idempotent=False)  # a resend adds a second

    def publish_reply(
        self, service: ServiceKeys, reply: OutboundReply, *, max_entries: int
    ) -> CommandCall[str]:
        """Put the agent's reply on the outbound stream for the bridge, which reads as
        replies come: an approximate MAXLEN of `max_entries`. The new entry's ID. Where
        the outbound stream shares the inbound stream's slot, finish_entry(reply=...)
        does this instead (publish_and_finish.lua)."""
        most = integer("max_entries", max_entries, 1)
        head: tuple[str | int, ...] = ("XADD", service.outbound, "MAXLEN", "~", most, "*")
        command = (*head, *reply.fields())
        return CommandCall((command,), text, idempotent=False)  # a resend publishes twice
