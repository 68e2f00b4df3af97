"""From a validated record to the payload Lua stores: ceiling, redaction, truncation, encoding.

The order is the contract (DESIGN section 6): input over the hard input ceiling
is refused whole, before any work; control characters other than tab and newline
are dropped; then the whole text is redacted; only then is it cut to its byte
limit, on a UTF-8 boundary, with a visible marker. Names
(tool, action) and idempotency keys are never redacted: one that looks like a
credential is refused, so no secret travels to Redis in any argument.

What is stored is always a fixed point of redaction, and so is the summary line
it will fold into (see `Preparer.settle`): restore re-runs redaction and refuses
any text it would still change, so the write path must never store one
(DESIGN section 6: whatever the write path stores, restore accepts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gridmem.codec import encode_payload
from gridmem.config import SUMMARY_LINE_BYTES
from gridmem.config import Limits
from gridmem.errors import InputTooLarge
from gridmem.errors import InvalidInput
from gridmem.errors import InvalidRecord
from gridmem.kinds import BY_NAME
from gridmem.records import ActionResult
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import Record
from gridmem.records import ToolSummary
from gridmem.redaction import Redactor

TRUNCATION_MARKER = " [truncated]"
# Stored instead of a text that no bounded repair makes a fixed point of redaction.
# Never seen in practice; it exists so that nothing unverified is ever stored.
WITHHELD = "[withheld]"
# Control characters other than tab and newline: no meaning in chat, and they can
# drive an operator's terminal. Removing them also bounds JSON escaping to 2x.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Rounds of repair before WITHHELD (each round removes what the last one exposed;
# real text settles in at most two).
_STABLE_ROUNDS = 4

# -- the summary line a record folds into --------------------------------------------------
# lua/lib.lua summary_line() in Python (both take their heads from gridmem/kinds.py),
# so the write path can check the line the
# summary will hold before the record is stored; tests/test_restore_roundtrip.py
# compares the two on folded records. The heads are also what restore accepts
# (gridmem/snapshots.py builds its summary-line pattern from them).
AVATAR_HEAD = BY_NAME["avatar_message"].summary_head()
AGENT_HEAD = BY_NAME["agent_reply"].summary_head()
FOLD_CUT_MARKER = " [...]"
UNREADABLE_LINE = "- (unreadable record, untrusted)"
_NEWLINES = re.compile("[\r\n]+")
# A stream entry ID, and the service's "<entry ID>:reply": the idempotency keys the
# worker service sends with every record. Digits around a dash match no rule of the
# redactor (tests/test_prepare.py checks the shape against the whole table), so
# they skip it: one redaction pass fewer per record on the service's hot path.
_ENTRY_KEY = re.compile(r"[0-9]{1,20}-[0-9]{1,20}(?::reply)?")


def tool_head(tool: str) -> str:
    return BY_NAME["tool_summary"].summary_head(tool)


def action_head(action: str, status: str) -> str:
    return BY_NAME["action_result"].summary_head(action, status)


def utf8_prefix(text: str, max_bytes: int) -> tuple[str, bool]:
    """At most `max_bytes` bytes of text, never cutting a character; True if it cut."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    cut = max_bytes
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # step back off a continuation byte
        cut -= 1
    return data[:cut].decode("utf-8"), True


def fold_line(head: str, text: str, line_bytes: int) -> tuple[str, bool]:
    """The summary line Lua folds a stored text into; True if the fold cut the text."""
    flat = _NEWLINES.sub(" ", text) if "\n" in text or "\r" in text else text
    room = line_bytes - len(head.encode("utf-8"))
    if len(flat) <= room and flat.isascii():
        return head + flat, False  # it fits whole (ASCII: a byte a character): no cut
    kept, cut = utf8_prefix(flat, room)
    if cut:
        kept = utf8_prefix(flat, max(0, room - len(FOLD_CUT_MARKER)))[0] + FOLD_CUT_MARKER
    return utf8_prefix(head + kept, line_bytes)[0], cut


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
    if len(value.encode("utf-8")) <= max_bytes:
        return value, False
    kept = utf8_prefix(value, max(0, max_bytes - len(TRUNCATION_MARKER)))[0]
    return kept + TRUNCATION_MARKER, True


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
        # what lua/lib.lua gets as summary_line_bytes (gridmem/scripts.py limits_packet)
        self.line_bytes = min(SUMMARY_LINE_BYTES, limits.max_summary_bytes)

    def text(
        self,
        value: str,
        field: str,
        max_bytes: int,
        head: str = AGENT_HEAD,
        *,
        required: bool = True,
        named: str | None = None,
    ) -> tuple[str, int, bool]:
        """(clean text, redactions, truncated) for one free-text field.

        `head` is the summary head the record folds under (the default is an
        agent reply's, as `stored_text()` wants). A `required` field (the record
        model refuses "") that is empty once control characters are gone is
        refused: stored as "", restore could not accept it. `named`: the value is
        a field of that name (a tool's summary): under a secret name (`password`,
        `DB_PASSWORD`) a bare secret-looking value is a secret too.
        """
        check_size(value, field, self.limits.max_input_bytes)
        clean = _CONTROL.sub("", value)
        if required and not clean:
            raise InvalidRecord(field, "holds nothing but control characters; nothing stored")
        if named is None:
            redacted, count = self.redactor.redact(clean)
        else:
            redacted, count = self.redactor.redact_named(named, clean)
        bounded, truncated = truncate(redacted, max_bytes)
        # untouched text: redact(bounded) is redact(clean), already computed
        checked = redacted == clean and not truncated
        stored, more, cut = self.settle(bounded, field, max_bytes, head, checked=checked)
        return stored, count + more, truncated or cut

    def settle(
        self, text: str, field: str, max_bytes: int, head: str, *, checked: bool = False
    ) -> tuple[str, int, bool]:
        """Repair `text` until it and its summary line are fixed points of redaction.

        A cut can shape what redaction let pass into a match: a 24-character
        `AKIA...` run is no AWS key, but its first 20 characters before
        " [truncated]" are. So can folding (newlines flattened, a cut marked
        " [...]"). Each round re-redacts what a cut exposed and cuts again. A fold
        that forms a match is repaired in the text itself: lines joined and
        redacted when joining formed it, the part the line shows redacted when the
        line's cut did; only when neither applies does the stored text become what
        the summary shows, redacted, which then folds to itself. Deterministic and bounded; a text
        that does not settle is stored as WITHHELD. `checked`: the caller knows
        `text` itself is a fixed point. Returns (text, redactions made, cut).
        """
        count, truncated = 0, False
        for _ in range(_STABLE_ROUNDS):
            if not checked:
                again, more = self.redactor.redact(text)
                if again != text:
                    count += more
                    text, cut = truncate(again, max_bytes)
                    truncated = truncated or cut
                    continue
            checked = False
            line, folded_cut = fold_line(head, text, self.line_bytes)
            shown, more = self.redactor.redact(line)
            if shown == line:
                return text, count, truncated
            if not shown.startswith(head):
                break  # the head itself takes part in the match: no text can fix that
            flat = _NEWLINES.sub(" ", text)
            joined, joined_count = self.redactor.redact(flat)
            if joined != flat:
                # Joining the lines formed the match ("password\n= x"): store the whole
                # text joined and redacted, so nothing but the secret and the line breaks
                # is lost (the summary line alone would keep only its first 240 bytes).
                count += joined_count
                text, cut = truncate(joined, max_bytes)
                truncated = truncated or cut
                continue
            kept = line[len(head) : -len(FOLD_CUT_MARKER)]
            if (
                folded_cut
                and line.endswith(FOLD_CUT_MARKER)
                and shown.endswith(FOLD_CUT_MARKER)
                and flat.startswith(kept)
            ):
                # The fold's cut shaped a match (a key-like run cut at the line's end):
                # redact that part of the text and keep the rest after it.
                count += more
                repaired = shown[len(head) : -len(FOLD_CUT_MARKER)] + flat[len(kept) :]
                text, cut = truncate(repaired, max_bytes)
                truncated = truncated or cut
                continue
            count += more
            text, cut = truncate(shown[len(head) :], max_bytes)
            truncated = truncated or folded_cut or cut
        if self.settled(WITHHELD, head, max_bytes):
            return WITHHELD, count + 1, True
        raise InvalidRecord(field, "cannot be stored without forming a secret; nothing stored")

    def settled(self, text: str, head: str, max_bytes: int) -> bool:
        """Is `text` storable as is: within its bound, and it and its summary line fixed points?"""
        line = fold_line(head, text, self.line_bytes)[0]
        return (
            len(text.encode("utf-8")) <= max_bytes
            and self.redactor.redact(text)[0] == text
            and self.redactor.redact(line)[0] == line
        )

    def name(self, value: str, field: str) -> str:
        """A short identifier is stored as given, or refused if it looks like a credential."""
        if value and not _ENTRY_KEY.fullmatch(value) and self.redactor.redact(value)[1]:
            raise InvalidInput(field, "looks like a credential; refused, nothing stored")
        return value

    def record(self, record: Record) -> PreparedRecord:
        text_limit = self.limits.max_text_bytes
        match record:
            case AvatarMessage(text=words):
                clean, count, cut = self.text(words, "text", text_limit, AVATAR_HEAD)
                fields = [clean]
            case AgentReply(text=words):
                clean, count, cut = self.text(words, "text", text_limit, AGENT_HEAD)
                fields = [clean]
            case ToolSummary(tool=tool, summary=summary):
                tool = self.name(tool, "tool")
                limit = self.limits.max_tool_result_bytes
                clean, count, cut = self.text(
                    summary, "summary", limit, tool_head(tool), named=tool
                )
                fields = [tool, clean]
            case ActionResult(action=action, status=status, detail=detail):
                action = self.name(action, "action")
                head = action_head(action, status)
                clean, count, cut = self.text(
                    detail, "detail", text_limit, head, required=False, named=action
                )
                fields = [action, status, clean]
        return PreparedRecord(encode_payload(record.kind, fields), count, cut)
