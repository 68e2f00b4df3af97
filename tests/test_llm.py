"""The LLM client: retries that stop, a failure that says nothing, and the offline responder."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gridmem.config import LlmSettings
from tests.test_inbound import INVISIBLE_ONLY
from worker.llm import OFFLINE_LABEL
from worker.llm import LlmUnavailable
from worker.llm import OfflineResponder
from worker.llm import OpenAICompatible
from worker.llm import build_chat_client
from worker.llm import clean_reply
from worker.llm import offline_reply
from worker.localllm import MALFORMED
from worker.localllm import MARK
from worker.localllm import LocalChatServer

MESSAGES = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hello"}]


def _client(responses: list[Any], seen: list[httpx.Request], **settings: Any) -> OpenAICompatible:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses.pop(0)
        if isinstance(item, Exception):
            raise item
        status, body = item
        return httpx.Response(status, json=body)

    config = LlmSettings(
        base_url="http://llm.test/v1", max_retries=2, retry_wait_seconds=0.001, **settings
    )
    return OpenAICompatible(config, transport=httpx.MockTransport(handle))


OK = (200, {"choices": [{"message": {"role": "assistant", "content": "hi there"}}]})


def test_posts_the_messages_with_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDMEM_TEST_KEY", "sk-test-secret")
    seen: list[httpx.Request] = []
    client = _client([OK], seen, api_key_env="GRIDMEM_TEST_KEY", model="m1")
    assert asyncio.run(client.complete(MESSAGES)) == "hi there"
    [request] = seen
    assert request.url == "http://llm.test/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test-secret"
    assert json.loads(request.content) == {"model": "m1", "messages": MESSAGES}


@pytest.mark.parametrize(
    "failure",
    [(500, {}), (503, {}), (429, {}), httpx.ReadTimeout("slow"), httpx.ConnectError("down")],
)
def test_transient_failures_are_retried_then_succeed(failure: Any) -> None:
    seen: list[httpx.Request] = []
    client = _client([failure, failure, OK], seen)
    assert asyncio.run(client.complete(MESSAGES)) == "hi there"
    assert len(seen) == 3


def test_retries_are_bounded() -> None:
    seen: list[httpx.Request] = []
    client = _client([(500, {})] * 10, seen)
    with pytest.raises(LlmUnavailable, match="HTTP 500"):
        asyncio.run(client.complete(MESSAGES))
    assert len(seen) == 3  # one try + max_retries


@pytest.mark.parametrize(
    "response",
    [
        (400, {}),
        (401, {}),
        (200, {"choices": []}),
        (200, {"choices": [{"message": {"content": "  "}}]}),
    ],
)
def test_other_failures_are_not_retried(response: Any) -> None:
    seen: list[httpx.Request] = []
    client = _client([response, OK], seen)
    with pytest.raises(LlmUnavailable) as caught:
        asyncio.run(client.complete(MESSAGES))
    assert len(seen) == 1 and "hello" not in str(caught.value)


def test_offline_responder_is_deterministic_and_says_what_it_is() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    reply = asyncio.run(OfflineResponder().complete(messages))
    assert reply == offline_reply(messages) and reply.startswith(OFFLINE_LABEL)
    assert '"second"' in reply and "first" not in reply
    assert isinstance(build_chat_client(LlmSettings()), OfflineResponder)
    assert isinstance(build_chat_client(LlmSettings(base_url="http://x/v1")), OpenAICompatible)


@pytest.mark.parametrize(
    ("reply", "cleaned"),
    [
        ("plain words", "plain words"),
        ("emoji \U0001f600 and \u00e9", "emoji \U0001f600 and \u00e9"),
        ("a \ud83d lone high surrogate", "a \ufffd lone high surrogate"),
        ("\udc00 lone low, then words", "\ufffd lone low, then words"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("bell\x07 stays for the store to drop", "bell\x07 stays for the store to drop"),
        ("", None),
        ("   \n\t ", None),
        ("\x00\x01\x1b\x7f\x9f", None),  # control characters only
        ("\u200b\u200d\u2060\ufeff\u00ad", None),  # invisible format characters only
        ("\ud800\udfff", None),  # nothing but what could not be stored
        *((text, None) for text in INVISIBLE_ONLY),  # issue 12, second pass
    ],
)
def test_clean_reply(reply: str, cleaned: str | None) -> None:
    """Regression (issue 12): a reply the store refuses (a lone surrogate) made the worker
    ask the model again every lease, forever. Now it is cleaned, or None: the caller
    answers with the failure notice."""
    assert clean_reply(reply, 1000) == cleaned


def test_clean_reply_cuts_on_a_character_boundary_under_the_ceiling() -> None:
    reply = "é" * 600  # 1200 bytes
    cut = clean_reply(reply, 1001)
    assert cut == "é" * 500  # 1000 bytes: the character cut in half is dropped whole
    assert clean_reply("abc", 3) == "abc"


# -- second pass: every call bounded, every malformed body a failure at once ---------------


def _local(server: LocalChatServer, **settings: Any) -> OpenAICompatible:
    config = {"timeout_seconds": 0.3, "max_retries": 1, "retry_wait_seconds": 0.001, **settings}
    return OpenAICompatible(LlmSettings(base_url=server.url, **config))


async def _ask(client: OpenAICompatible) -> str:
    try:
        # the bound here only turns a hang into a failure; the client must end far sooner
        return await asyncio.wait_for(client.complete(MESSAGES), 30)
    finally:
        await client.aclose()


@pytest.mark.parametrize("fault", ["trickle", "headers-stall"])
def test_a_server_that_trickles_or_stalls_after_its_headers_is_cut_off(fault: str) -> None:
    """Regression (issue 12, second pass): the timeout was per read, so a server sending
    one byte at a time (each read on time) held the call, and its entry, forever.
    Now each try has one deadline for the whole exchange; then the retry path."""
    with LocalChatServer(faults=[fault, fault], stall_seconds=60, trickle_seconds=0.02) as server:
        with pytest.raises(LlmUnavailable, match=r"deadline|ReadTimeout"):
            asyncio.run(_ask(_local(server)))
        assert len(server.requests) == 2  # one try and one retry, each cut off


def test_an_over_large_body_is_abandoned_and_not_retried() -> None:
    """A 200 whose body is larger than any reply could be (no Content-Length, read
    until close) is abandoned unread past MAX_BODY_BYTES: no retry, no memory blow-up."""
    with LocalChatServer(faults=["huge", "huge"]) as server:
        with pytest.raises(LlmUnavailable, match="response too large"):
            asyncio.run(_ask(_local(server, timeout_seconds=20)))
        assert len(server.requests) == 1


@pytest.mark.parametrize("fault", sorted(MALFORMED))
def test_a_malformed_200_is_a_failure_at_once_and_says_nothing_of_the_body(fault: str) -> None:
    """Issue 12, second pass: a 200 that is not a usable chat completion (not JSON, no
    choices, a content that is a list or null) fails the call at once: the same server
    would say the same, so no retry storm; the error holds none of the body."""
    with LocalChatServer(faults=[fault, fault]) as server:
        with pytest.raises(LlmUnavailable) as caught:
            asyncio.run(_ask(_local(server)))
        assert len(server.requests) == 1
    assert MARK not in str(caught.value) and caught.value.__cause__ is None
    assert str(caught.value) in {"malformed response", "empty response"}
