"""Talking to the language model: any OpenAI-compatible endpoint, or the offline responder.

The API key is read from the environment variable the settings name, sent as a
bearer token, and never stored or logged. Each try has one deadline for the whole
exchange (connect, headers and body: `timeout_seconds`), not only per read, so a
server that trickles a byte a second, or sends headers and stalls, cannot hold an
entry; a body over MAX_BODY_BYTES is abandoned unread. Timeouts, transport
errors, 429 and 5xx are retried with exponential backoff a bounded number of
times; a call therefore ends within (max_retries + 1) x timeout_seconds plus the
backoff waits. A malformed 200 (not JSON, no choices, a content that is not a
string, an over-large body) is not retried: the same server would say the same.
Either way the caller gets LlmUnavailable (a fixed message, never any of the
body) and answers the resident with FAILURE_NOTICE.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import unicodedata
from typing import Any
from typing import NamedTuple
from typing import Protocol

import aiohttp
import tenacity

from gridmem.budget import TokenCounter
from gridmem.budget import utf8_bytes
from gridmem.config import LlmSettings
from gridmem.context import ACTION_RESULT_HEAD
from gridmem.context import SUMMARY_HEADER
from gridmem.context import TOOL_RESULT_HEAD
from gridmem.errors import ConfigError
from gridmem.redaction import Redactor
from gridmem.tokens import token_counter

FAILURE_NOTICE = (
    "(Sorry, I can't answer right now: my language model is not responding. "
    "Please try again in a moment.)"
)
OFFLINE_LABEL = "(offline responder: no language model is configured)"

Message = dict[str, str]

# A chat completion's body: the reply (at most the store's input ceiling, 1 MiB by
# default, plus JSON escaping up to 6x and the envelope) fits well under this.
MAX_BODY_BYTES = 8 << 20

# JSON may carry lone surrogates ("\ud800"); UTF-8, and so Redis, cannot hold them.
_SURROGATE = re.compile("[\ud800-\udfff]")
# What a reader never sees: whitespace (and the blank look-alikes U+2800, the Hangul
# fillers), control characters, the replacement character a lone surrogate became,
# and Unicode's default-ignorable code points (DerivedCoreProperties.txt: soft
# hyphen, combining grapheme joiner, zero-width and bidi controls, word joiner and
# invisible operators, variation selectors, BOM, the tags block, ...).
_INVISIBLE = (
    "\\s\x00-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0"
    "\ufff0-\ufffb\ufffd\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
# A character a reader would see: anything else.
_VISIBLE = re.compile(f"[^{_INVISIBLE}]")


# A resident's display name goes to the model as the OpenAI `name` of their message.
# OpenAI has checked that field against ^[a-zA-Z0-9_-]{1,64}$, ^[a-zA-Z0-9_-]+$ and
# ^[^\s<|\\/>]+$ over the years; a name of these characters passes all three.
NAME_MAX_CHARS = 64
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")
# Rounds of sanitise-then-redact before a name is dropped (real names settle in one).
_NAME_ROUNDS = 3
_NOT_THEIRS = (TOOL_RESULT_HEAD, ACTION_RESULT_HEAD, SUMMARY_HEADER)


def display_name(raw: str, redactor: Redactor) -> str | None:
    """A resident's display name as the `name` field of their message, or None.

    Redacted first, as pasted (a secret is recognised in its own shape, and the
    redactor sees through invisible and full-width characters); then folded (NFKD,
    accents dropped: "Zoë" -> "Zoe"), each run of characters OpenAI does not take
    made one `_` ("Ann Resident" -> "Ann_Resident", a redaction marker ->
    "REDACTED_<rule>"), and cut to 64 characters.
    Sanitising or cutting can shape a new match (`password = x` -> `password_x`), so
    the result is redacted again until nothing changes. Nothing usable left (a name
    of emoji, or one that does not settle): None, and the message goes without a
    name. Little fits in it (one 64-character word of letters, digits, `_` and `-`),
    and it is the resident's own claim, untrusted like their words.
    """
    text = redactor.redact(raw)[0]
    for _ in range(_NAME_ROUNDS):
        name = _NOT_NAME.sub("_", _fold(text)).strip("_")
        name = name[:NAME_MAX_CHARS].rstrip("_")
        text = redactor.redact(name)[0]
        if text == name:
            return name or None
    return None


def _fold(text: str) -> str:
    """Compatibility forms folded and accents dropped: "Ｚｏë" -> "Zoe"."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def with_name(messages: list[Message], name: str | None) -> list[Message]:
    """`messages` with `name` on the resident's newest message, the one being answered.

    Only that one, and never on a tool or action result or the summary (user-role
    data too, not the resident's words): an agent may record a tool result into the
    session between the resident's message and this request. A resident who opens
    a message like a tool result only goes unnamed.
    """
    if name is None:
        return messages
    for message in reversed(messages):
        if message["role"] == "assistant":
            break  # the resident's newest message comes after the agent's last reply
        if message["role"] == "user" and not message["content"].startswith(_NOT_THEIRS):
            message["name"] = name
            break
    return messages


class LlmUnavailable(Exception):
    """The model did not answer usefully, retries included. Carries no content."""


class _Retryable(LlmUnavailable):
    """A failure worth another try: timeout, transport error, 429, 5xx."""


class ChatClient(Protocol):
    name: str

    async def complete(self, messages: list[Message]) -> str:
        """The assistant's reply to `messages` (system prompt first)."""
        ...

    async def aclose(self) -> None: ...


class OpenAICompatible:
    """POST {base_url}/chat/completions, as OpenAI, vLLM, llama.cpp, Ollama and others serve it.

    aiohttp, one session and one pool of `connections` kept-alive HTTP/1.1
    connections (aiohttp sets TCP_NODELAY), made on the first call inside the
    running event loop. Chosen over httpx by bench/service.py's client yardstick
    (`--clients`, docs/benchmarks.md, issue 16): httpcore's pool looks at each of
    its connections for every request it places, so httpx, even split into pools
    of 32 or of 4, stayed at 0.19-0.81 of C / L from 256 calls in flight, where
    aiohttp reached 1.2-2.5x that on the same run.
    """

    name = "openai-compatible"

    def __init__(self, settings: LlmSettings, *, connections: int = 100):
        if settings.base_url is None:
            raise ValueError("llm.base_url is not set")
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        self._headers = {}
        key = os.environ.get(settings.api_key_env)
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self.model = settings.model
        self._deadline = settings.timeout_seconds
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(settings.max_retries + 1),
            wait=tenacity.wait_exponential(multiplier=settings.retry_wait_seconds, max=30)
            + tenacity.wait_random(0, settings.retry_wait_seconds / 2),
            reraise=True,
        )

    async def complete(self, messages: list[Message]) -> str:
        # a copy per call: a Retrying object keeps its attempt state, and calls run concurrently
        reply: str = await self._retrying.copy()(self._once, messages)
        return reply

    async def _once(self, messages: list[Message]) -> str:
        try:
            async with asyncio.timeout(self._deadline):
                status, body = await self._exchange(messages)
        except TimeoutError:
            raise _Retryable("deadline") from None
        except aiohttp.ClientError as exc:  # connect, reset, a cut or malformed response
            raise _Retryable(type(exc).__name__) from None
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}")
        if status >= 400:
            raise LlmUnavailable(f"HTTP {status}")
        return _content(body)

    def _http(self) -> aiohttp.ClientSession:
        """The session, made on first use: aiohttp binds it to the running loop."""
        if self._session is None:
            pool = aiohttp.TCPConnector(limit=self._connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=pool,
                headers=self._headers,
                # the deadline is _once's, for the whole exchange; no second clock here
                timeout=aiohttp.ClientTimeout(total=None),
                # no cookie is kept from one resident's call for the next one's
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def _exchange(self, messages: list[Message]) -> tuple[int, bytes]:
        """POST and read the body, at most MAX_BODY_BYTES of it. A body left unread
        (an error status's, an over-large one) closes its connection on the way out:
        aiohttp returns a connection to the pool only once its response is read whole."""
        request = {"model": self.model, "messages": messages}
        post = self._http().post(self._url, json=request, allow_redirects=False)
        async with post as response:
            if response.status != 200:
                return response.status, b""  # the body of an error is never read
            if (response.content_length or 0) > MAX_BODY_BYTES:
                raise LlmUnavailable("response too large")
            chunks, size = [], 0
            async for chunk in response.content.iter_any():  # decoded: a gzip bomb stops too
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise LlmUnavailable("response too large")
                chunks.append(chunk)
        return 200, b"".join(chunks)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _content(body: bytes) -> str:
    """The reply in a chat completion's body; LlmUnavailable (saying nothing of the
    body) if it is not one."""
    try:
        data: Any = json.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise LlmUnavailable("malformed response") from None
    if not isinstance(content, str):
        raise LlmUnavailable("malformed response")
    if not content.strip():
        raise LlmUnavailable("empty response")
    return content


def clean_reply(reply: str, max_bytes: int) -> str | None:
    """The model's reply in a form the store takes as given, or None if nothing is left.

    Whatever a model returns must end as a stored reply or a failure notice, never as
    an error that would ask the model again and again: lone surrogates become U+FFFD,
    a reply over the store's input ceiling (`max_bytes`) is cut on a UTF-8 boundary
    (the store then bounds it to max_text_bytes with its marker), and a reply with
    nothing visible in it (whitespace, control or invisible characters only) is None.
    """
    text = _SURROGATE.sub("\ufffd", reply)
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        text = data[:max_bytes].decode("utf-8", "ignore")  # drops a cut character's head
    if not has_visible_text(text):
        return None
    return text


def has_visible_text(text: str) -> bool:
    """Whether a reader would see anything: a resident's message of nothing but control
    or invisible characters is no message, and neither is such a reply."""
    return _VISIBLE.search(text) is not None


class OfflineResponder:
    """A deterministic stand-in when no endpoint is configured. It says what it is.

    It answers from the context it was given only, so it can never show one
    resident another's words.
    """

    name = "offline"

    async def complete(self, messages: list[Message]) -> str:
        return offline_reply(messages)

    async def aclose(self) -> None:
        return None


def offline_reply(messages: list[Message]) -> str:
    said = [m["content"] for m in messages if m["role"] == "user"]
    last = said[-1] if said else ""
    if len(last) > 200:
        last = last[:200] + "..."
    earlier = len([m for m in messages if m["role"] != "system"]) - 1
    return (
        f'{OFFLINE_LABEL} You said: "{last}". I remember {max(earlier, 0)} earlier messages here.'
    )


# Chat formats add a few tokens per message around its content (OpenAI: 3, and 1
# more for a `name`); 3 more prime the reply. Counted generously.
MESSAGE_OVERHEAD_TOKENS = 4
REPLY_PRIMING_TOKENS = 3


class ContextBudget(NamedTuple):
    """What the service passes to store.context: the tokens left for the conversation
    (None: no budget) and the counter, message overhead included."""

    max_tokens: int | None
    count_tokens: TokenCounter


def context_budget(settings: LlmSettings) -> ContextBudget:
    """The conversation's share of `llm.context_tokens`: the window less the system
    prompt, the reply budget, the reply priming and the resident's name (with_name,
    at most NAME_MAX_CHARS); every message counted with its overhead. A window too
    small for any conversation is a startup error, not an empty context."""
    base = utf8_bytes if settings.tokenizer == "bytes" else token_counter(settings.tokenizer)

    def count(text: str) -> int:
        return base(text) + MESSAGE_OVERHEAD_TOKENS

    if settings.context_tokens is None:
        return ContextBudget(None, count)
    fixed = count(settings.system_prompt) + settings.reply_tokens + REPLY_PRIMING_TOKENS
    left = settings.context_tokens - fixed - NAME_MAX_CHARS
    if left <= MESSAGE_OVERHEAD_TOKENS:
        raise ConfigError(
            f"llm.context_tokens: {settings.context_tokens} leaves no room for the "
            f"conversation after the system prompt and llm.reply_tokens ({fixed} tokens)"
        )
    return ContextBudget(left, count)


def build_chat_client(settings: LlmSettings, connections: int = 100) -> ChatClient:
    """The endpoint's client, its pool sized to `connections` calls at once (the
    worker's concurrency), or the offline responder."""
    if settings.base_url is None:
        return OfflineResponder()
    return OpenAICompatible(settings, connections=connections)
