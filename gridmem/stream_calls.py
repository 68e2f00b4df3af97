"""The worker service's stream scripts' calls: the inbound queue, its per-conversation
mailboxes and leases, the dead-letter and outbound streams. Each returns a
`ScriptCall` (gridmem/replies.py) and talks to no server."""

from __future__ import annotations

from gridmem.keys import ServiceKeys
from gridmem.replies import (
    AttemptCount,
    KeyStep,
    ScriptCall,
    ScriptCalls,
    TakenEntry,
    _parse_attempt,
    _parse_raw_fields,
    _parse_step,
    _parse_taken,
    _parse_texts,
    text,
)


class StreamCalls(ScriptCalls):
    """One typed method per service stream script."""

    def ensure_group(self, service: ServiceKeys, *, group: str) -> ScriptCall[bool]:
        return self._call("ensure_group", (service.inbound,), (group,), bool)

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
    ) -> ScriptCall[KeyStep]:
        """Counts nothing: safe to resend."""
        return self._call(
            "claim_key",
            (service.ready, service.attempts, service.rejected),
            (member, owner, lease_ms, also),
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
        """Safe to resend: the token makes a repeated call count its attempt once."""
        return self._call(
            "begin_attempt",
            (service.ready, service.attempts),
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
    ) -> ScriptCall[KeyStep]:
        return self._call(
            "finish_entry",
            (service.inbound, service.ready, service.attempts, service.rejected),
            (group, entry_id, member, owner, lease_ms, int(release)),
            _parse_step,
        )

    def renew_lease(
        self, service: ServiceKeys, *, member: str, owner: str, lease_ms: int
    ) -> ScriptCall[bool]:
        return self._call("renew_lease", (service.ready,), (member, owner, lease_ms), bool)

    def orphaned_keys(self, service: ServiceKeys, *, sample: int) -> ScriptCall[list[str]]:
        return self._call("orphaned_keys", (service.ready,), (sample,), _parse_texts)

    def read_inbound(
        self, service: ServiceKeys, *, entry_id: str
    ) -> ScriptCall[list[tuple[bytes, bytes]]]:
        return self._call("read_inbound", (service.inbound,), (entry_id,), _parse_raw_fields)

    def read_backlog(self, service: ServiceKeys) -> ScriptCall[int]:
        return self._call("read_backlog", (service.inbound,), (), int)

    def dead_letter(
        self, service: ServiceKeys, *, entry_id: str, reason: str, max_entries: int
    ) -> ScriptCall[str]:
        return self._call(
            "dead_letter", (service.dead,), (entry_id, reason, max_entries), text, idempotent=False
        )

    def publish_reply(
        self,
        service: ServiceKeys,
        *,
        avatar_uuid: str,
        channel: str,
        text_: str,
        in_reply_to: str,
        session_id: str,
        max_entries: int,
    ) -> ScriptCall[str]:
        return self._call(
            "publish_reply",
            (service.outbound,),
            (avatar_uuid, channel, text_, in_reply_to, session_id, max_entries),
            text,
            idempotent=False,  # a resend would publish the reply twice
        )
