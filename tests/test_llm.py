"""The LLM client: retries that stop, a failure that says nothing, and the offline responder."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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
from worker.localllm import Fault
from worker.localllm import LocalChatServer

MESSAGES = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hello"}]


def _client(server: LocalChatServer, **settings: Any) -> OpenAICompatible:
    """A client of `server`, two retries. The deadline makes a stall (5 s) a timeout,
    and is long enough that a loaded machine's immediate answer never is one."""
    config = {"timeout_seconds": 2.0, "max_retries": 2, "retry_wait_seconds": 0.001, **settings}
    return OpenAICompatible(LlmSettings(base_url=server.url, **config))


def _ask_once(client: OpenAICompatible) -> str:
    async def ask() -> str:
        try:
            return await asyncio.wait_for(client.complete(MESSAGES), 30)  # a hang fails
        finally:
            await client.aclose()

    return asyncio.run(ask())


def test_posts_the_messages_with_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDMEM_TEST_KEY", "sk-test-secret")
    with LocalChatServer() as server:
        reply = _ask_once(_client(server, api_key_env="GRIDMEM_TEST_KEY", model="m1"))
        [body], [headers] = server.requests, server.headers
    assert reply == offline_reply(MESSAGES)
    assert headers["authorization"] == "Bearer sk-test-secret"
    assert body == {"model": "m1", "messages": MESSAGES}


def test_no_key_in_the_environment_sends_no_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRIDMEM_TEST_KEY", raising=False)
    with LocalChatServer() as server:
        _ask_once(_client(server, api_key_env="GRIDMEM_TEST_KEY"))
        [headers] = server.headers
    assert "authorization" not in headers


# 500, 503, 429: statuses; "stall": no answer within the deadline (a timeout);
# "drop": the connection closed unanswered (a transport error)
TRANSIENT: list[Fault] = [500, 503, 429, "stall", "drop"]


@pytest.mark.parametrize("failure", TRANSIENT)
def test_transient_failures_are_retried_then_succeed(failure: Fault) -> None:
    with LocalChatServer(faults=[failure, failure], stall_seconds=5) as server:
        assert _ask_once(_client(server)) == offline_reply(MESSAGES)
        assert len(server.requests) == 3


def test_retries_are_bounded() -> None:
    with LocalChatServer(faults=[500] * 10) as server:
        with pytest.raises(LlmUnavailable, match="HTTP 500"):
            _ask_once(_client(server))
        assert len(server.requests) == 3  # one try + max_retries


def test_retries_wait_and_back_off() -> None:
    """The waits between tries grow (exponential backoff), so a struggling server is
    not asked again at once: each retry starts later after the previous answer."""
    with LocalChatServer(faults=[503, 503, 503]) as server:
        with pytest.raises(LlmUnavailable, match="HTTP 503"):
            _ask_once(_client(server, retry_wait_seconds=0.2))
        spans = server.spans
    waits = [spans[n + 1][0] - spans[n][1] for n in range(len(spans) - 1)]
    assert len(waits) == 2 and waits[0] >= 0.2 and waits[1] >= 0.4, waits


@pytest.mark.parametrize("response", [400, 401, "no-choices", "content-blank"])
def test_other_failures_are_not_retried(response: Fault) -> None:
    with LocalChatServer(faults=[response, response]) as server:
        with pytest.raises(LlmUnavailable) as caught:
            _ask_once(_client(server))
        assert len(server.requests) == 1
    assert "hello" not in str(caught.value) and MARK not in str(caught.value)


def test_the_key_is_in_no_error_and_no_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every failure, retried or not, says nothing of the key it was sent with."""
    monkeypatch.setenv("GRIDMEM_TEST_KEY", "sk-test-secret")
    caplog.set_level(logging.DEBUG)
    faults: list[Fault] = [401, 500, "drop", "stall", "bad-json"]
    with LocalChatServer(faults=faults, stall_seconds=5) as server:
        errors = []
        for _ in range(3):
            with pytest.raises(LlmUnavailable) as caught:
                _ask_once(_client(server, api_key_env="GRIDMEM_TEST_KEY", max_retries=1))
            errors.append(caught.value)
        assert [h["authorization"] for h in server.headers] == ["Bearer sk-test-secret"] * 5
    for error in errors:
        assert "sk-test" not in repr(error) and error.__cause__ is None
    assert "sk-test" not in caplog.text


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
