"""Token-budget projection: the newest part of a context that fits a model's window.

`fit` is a pure function of the messages, the budget and the counter, so one
session read twice gives one answer (and the same on both doors). It keeps the
newest turns that fit whole (a contiguous run back from the newest: skipping a
large turn to keep older ones would hand the model a conversation with a hole
in it), then the summary of earlier conversation if it still fits, in front.
When not even the newest message fits, that message is cut to the budget with
a visible CUT_MARKER; a summary or tool result keeps its first line, the marker
that says it is untrusted data, or is left out whole. Nothing else is ever
shortened.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

from gridmem.context import SUMMARY_HEADER
from gridmem.context import TOOL_RESULT_HEAD
from gridmem.errors import InvalidInput
from gridmem.records import ContextMessage
from gridmem.validate import plain_int

TokenCounter = Callable[[str], int]

# Shown where a message was cut to fit the budget, so neither the model nor a
# person reading a log takes a cut message for the whole.
CUT_MARKER = "\n[... cut to fit the context budget]"


def utf8_bytes(text: str) -> int:
    """The default counter: UTF-8 bytes, never fewer than the tokens of a byte-level
    BPE tokenizer (OpenAI's cl100k_base and o200k_base, GPT-2's, Llama 3's): each of
    their tokens stands for at least one byte. It overcounts English about fourfold;
    `gridmem[tokens]` gives exact counts (gridmem.tokens)."""
    return len(text.encode("utf-8", "surrogatepass"))


def budget_arguments(max_tokens: object, count_tokens: object) -> tuple[int | None, TokenCounter]:
    """The checked arguments of context(); refused before Redis is touched."""
    if max_tokens is not None:
        budget = plain_int(max_tokens)
        if budget is None or budget < 0:
            raise InvalidInput("max_tokens", "must be None or an integer >= 0")
        max_tokens = budget
    if count_tokens is None:
        return max_tokens, utf8_bytes
    if not callable(count_tokens):
        raise InvalidInput("count_tokens", "must be a callable taking text and returning an int")
    return max_tokens, count_tokens


def fit(
    messages: Sequence[ContextMessage],
    has_summary: bool,
    max_tokens: int,
    count: TokenCounter,
) -> list[ContextMessage]:
    """The messages (summary first if `has_summary`) that fit `max_tokens` as `count` counts."""
    count = _checked(count)
    summary = messages[0] if has_summary and messages else None
    turns = messages[1:] if summary is not None else messages
    left = max_tokens
    kept: list[ContextMessage] = []
    for message in reversed(turns):
        cost = count(message.content)
        if cost > left:
            break
        kept.append(message)
        left -= cost
    kept.reverse()
    if summary is not None and count(summary.content) <= left:
        return [summary, *kept]
    if kept:
        return kept
    newest = turns[-1] if turns else summary
    if newest is None:
        return []
    cut = _cut(newest, max_tokens, count)
    return [cut] if cut is not None else []


def _checked(count: TokenCounter) -> TokenCounter:
    """`count`, refusing what is not a count (a float, a bool, a negative number)."""
    if count is utf8_bytes:
        return count  # ours: always an int >= 0

    def checked(text: str) -> int:
        tokens = count(text)
        if type(tokens) is not int and plain_int(tokens) is None:
            raise InvalidInput("count_tokens", "must return an integer >= 0")
        if tokens < 0:
            raise InvalidInput("count_tokens", "must return an integer >= 0")
        return tokens

    return checked


def _head(content: str) -> str:
    """The part of a message a cut must keep: the marker line of untrusted data."""
    if content.startswith((SUMMARY_HEADER, TOOL_RESULT_HEAD)):
        line_end = content.find("\n")
        return content if line_end < 0 else content[: line_end + 1]
    return ""


def _cut(message: ContextMessage, max_tokens: int, count: TokenCounter) -> ContextMessage | None:
    """The longest start of `message` that fits with CUT_MARKER, or None if not even
    its marker line and CUT_MARKER fit. Binary search over the characters kept."""
    head = _head(message.content)
    body = message.content[len(head) :]

    def text(keep: int) -> str:
        return f"{head}{body[:keep]}{CUT_MARKER}"

    if count(text(0)) > max_tokens:
        return None
    low, high = 0, len(body)  # text(low) fits; find the largest such low
    while low < high:
        middle = (low + high + 1) // 2
        if count(text(middle)) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return message.model_copy(update={"content": text(low)})
