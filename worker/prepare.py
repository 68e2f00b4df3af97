"""From a validated record to the payload Lua stores: ceiling, redaction, truncation, encoding.

The order is the contract (DESIGN section 6): input over the hard input ceiling
is refused whole, before any work; control characters other than tab and newline
are dropped; then the whole text is redacted; only then is it cut to its byte
limit, on a UTF-8 boundary, with a visible marker. Names
(tool, action) and idempotency keys are never redacted: one that looks like a
credential is refused, so no secret travels to Redis in any argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.codec import encode_payload
from worker.config import Limits
from worker.errors import InputTooLarge, InvalidInput, InvalidRecord
from worker.records import ActionResult, AgentReply, AvatarMessage, Record, ToolSummary
from worker.redaction import Redactor

TRUNCATION_MARKER = " [truncated]"
# Control characters other than tab and newline: no meaning in chat, and they can
# drive an operator's terminal. Removing them also bounds JSON escaping to 2x.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def check_size(value: str, field: str, max_input_bytes: int) -> None:
    """Refuse text over the input ceiling (and text that is not valid Unicode)."""
    if len(value) > max_input_bytes:  # cheap: never fewer bytes than characters
        raise InputTooLarge(
            field, f"over the input ceiling of {max_input_bytes} bytes; nothing stored"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRecord(field, "is not valid Unicode text (lone surrogate)") from None
    if size > max_input_bytes:
        raise InputTooLarge(
            field, f"over the input ceiling of {max_input_bytes} bytes; nothing stored"
        )


def truncate(value: str, max_bytes: int) -> tuple[str, bool]:
    """Cut to `max_bytes` on a UTF-8 boundary, marker included. Returns (text, truncated)."""
    data = value.encode("utf-8")
    if len(data) <= max_bytes:
        return value, False
    marker = TRUNCATION_MARKER.encode("utf-8")
    cut = max(0, max_bytes - len(marker))
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # step back off a continuation byte
        cut -= 1
    return data[:cut].decode("utf-8") + TRUNCATION_MARKER, True


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    payload: str
    redactions: int
    truncated: bool


class Preparer:
    """Cleans records with one limit set and one redactor."""

    def __init__(self, limits: Limits, redactor: Redactor) -> None:
        self.limits = limits
        self.redactor = redactor

    def text(self, value: str, field: str, max_bytes: int) -> tuple[str, int, bool]:
        """(clean text, redactions, truncated) for one free-text field."""
        check_size(value, field, self.limits.max_input_bytes)
        redacted, count = self.redactor.redact(_CONTROL.sub("", value))
        bounded, truncated = truncate(redacted, max_bytes)
        return bounded, count, truncated

    def name(self, value: str, field: str) -> str:
        """A short identifier is stored as given, or refused if it looks like a credential."""
        if value and self.redactor.redact(value)[1]:
            raise InvalidInput(field, "looks like a credential; refused, nothing stored")
        return value

    def record(self, record: Record) -> PreparedRecord:
        text_limit = self.limits.max_text_bytes
        match record:
            case AvatarMessage(text=words) | AgentReply(text=words):
                clean, count, cut = self.text(words, "text", text_limit)
                fields = [clean]
            case ToolSummary(tool=tool, summary=summary):
                tool = self.name(tool, "tool")
                clean, count, cut = self.text(summary, "summary", self.limits.max_tool_result_bytes)
                fields = [tool, clean]
            case ActionResult(action=action, status=status, detail=detail):
                action = self.name(action, "action")
                clean, count, cut = self.text(detail, "detail", text_limit)
                fields = [action, status, clean]
        return PreparedRecord(encode_payload(record.kind, fields), count, cut)
