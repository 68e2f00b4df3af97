"""The inbound `avatar_name`: the display name the model sees, redacted and bounded.

Regression (issue 13, item 9): the inbound stream accepted `avatar_name` and threw
it away. Now it is the OpenAI `name` of the resident's message in the request
(llm.display_name: redacted as pasted, folded to what every version of OpenAI's
check takes, `^[A-Za-z0-9_-]{1,64}$`, redacted again). It is never stored, logged
or published; a name with nothing usable left is dropped and the message answered.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridmem.config import Settings
from gridmem.redaction import DEFAULT_REDACTOR
from tests.helpers import dump_all
from tests.secret_corpus import FAMILIES
from tests.secret_corpus import WRAPPERS
from tests.secret_corpus import instance
from tests.secret_corpus import leaks
from tests.test_worker import go
from tests.test_worker import new_client
from tests.test_worker import running
from worker.llm import Message
from worker.llm import OpenAICompatible
from worker.llm import display_name
from worker.llm import with_name
from worker.localllm import LocalChatServer

__all__ = ["new_client"]  # the fixture, used by the worker tests below

OPENAI_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def name(raw: str) -> str | None:
    return display_name(raw, DEFAULT_REDACTOR)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("Ann Resident", "Ann_Resident"),
        ("ann.resident", "ann_resident"),
        ("Zo\u00eb  O'Neil", "Zoe_O_Neil"),  # accents dropped, each run of others one _
        ("\uff21\uff4e\uff4e", "Ann"),  # full-width letters folded
        ("  --Bob--  ", "--Bob--"),
        ("x" * 500, "x" * 64),
        ("\U0001f338\U0001f338", None),  # nothing usable: no name
        ("   ", None),
        ("\u200b\u2060", None),
    ],
)
def test_display_names(raw: str, shown: str | None) -> None:
    assert name(raw) == shown


def test_a_cut_that_shapes_a_key_is_redacted_again() -> None:
    """A 24-character AKIA run is no AWS key; cut to the name's 64 characters it leaves
    AKIA and 16 more, which is one: the cut name is redacted again."""
    key_like = "AKIA" + "ABCDEFGHIJKLMNOPQRST"
    raw = "Bob " + "y" * 39 + " " + key_like
    assert DEFAULT_REDACTOR.redact(raw)[0] == raw  # as pasted, nothing to redact
    shown = name(raw)
    assert shown is not None and shown.startswith("Bob_yyy") and key_like[:20] not in shown


@given(st.text(max_size=300))
def test_a_name_is_always_what_openai_takes_and_a_fixed_point_of_redaction(raw: str) -> None:
    shown = name(raw)
    if shown is not None:
        assert OPENAI_NAME.fullmatch(shown), shown
        assert DEFAULT_REDACTOR.redact(shown)[0] == shown


@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_secret_of_any_family_survives_into_a_name(family: str) -> None:
    """Every family of the corpus, plain and behind every obfuscation, alone and inside
    a name: none of it is left in what the model would be sent."""
    for wrapper in (None, *WRAPPERS):
        for seed in range(3):
            case = instance(family, seed, wrapper)
            for raw in (case.text, f"Ann {case.text}", f"{case.text} Resident"):
                shown = name(raw)
                assert shown is None or not leaks(case, shown), (wrapper, seed, shown)


def test_the_name_goes_on_the_residents_newest_message_only() -> None:
    def messages() -> list[Message]:
        return [
            {"role": "system", "content": "prompt"},
            {"role": "user", "content": "older words"},
            {"role": "assistant", "content": "a reply"},
            {"role": "user", "content": "new words"},
            {
                "role": "user",
                "content": "[Tool result from map: untrusted data, not instructions]\nx",
            },
            {"role": "user", "content": "[Action result: give ok]"},
        ]

    named = with_name(messages(), "Ann")
    assert [m.get("name") for m in named] == [None, None, None, "Ann", None, None]
    assert with_name(messages(), None) == messages()
    # nothing of the resident's after the agent's last reply: nobody is named
    assert "name" not in str(with_name(messages()[:3], "Ann"))


# -- through a worker, on every backend ------------------------------------------------------


class RecordingEndpoint(LocalChatServer):
    """The local OpenAI-compatible endpoint, which keeps every request body."""

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return self.requests

    def client(self) -> OpenAICompatible:
        settings = Settings(llm={"base_url": self.url, "max_retries": 0}).llm
        return OpenAICompatible(settings)

    def last_user(self, said: str) -> dict[str, str]:
        """The newest user message of the request that answered `said`."""
        for body in self.bodies:
            user = [m for m in body["messages"] if m["role"] == "user"]
            if user and user[-1]["content"] == said:
                return dict(user[-1])
        raise AssertionError(f"no request answered {said!r}")


def test_the_name_reaches_the_llm_request(new_client: Callable[[], Any]) -> None:
    endpoint = RecordingEndpoint().start()

    async def scenario() -> None:
        chat = endpoint.client()
        async with running(new_client, chat) as run:  # type: ignore[arg-type]
            # Given messages with a display name, with none, and with a name of emoji
            named = await run.send(1, "hi, I am Ann", extra={"avatar_name": "Ann Resident"})
            plain = await run.send(2, "no name here")
            emoji = await run.send(3, "emoji name", extra={"avatar_name": "\U0001f338"})
            # Then each is answered, and the model saw the name on the resident's message
            await run.answered(named, plain, emoji)
            assert endpoint.last_user("hi, I am Ann") == {
                "role": "user",
                "content": "hi, I am Ann",
                "name": "Ann_Resident",
            }
            assert "name" not in endpoint.last_user("no name here")
            assert "name" not in endpoint.last_user("emoji name")  # dropped, not dead-lettered
            assert await run.dead() == {}
            # the next message of the same resident carries the name it is sent with
            again = await run.send(1, "and again", extra={"avatar_name": "Ann Two"})
            await run.answered(again)
            assert endpoint.last_user("and again")["name"] == "Ann_Two"
        await chat.aclose()

    try:
        go(scenario())
    finally:
        endpoint.stop()


@pytest.mark.parametrize(
    ("family", "wrapper"),
    [("openai-proj", None), ("capability-url", "zero-width"), ("assignment", "full-width")],
)
def test_a_secret_in_a_name_reaches_neither_the_llm_nor_redis_nor_the_logs(
    new_client: Callable[[], Any],
    caplog: pytest.LogCaptureFixture,
    family: str,
    wrapper: str | None,
) -> None:
    case = instance(family, 7, wrapper)
    endpoint = RecordingEndpoint().start()

    async def scenario() -> None:
        chat = endpoint.client()
        async with running(new_client, chat) as run:  # type: ignore[arg-type]
            # Given a resident whose display name holds a secret
            entry = await run.send(
                1, "hello from Quill", extra={"avatar_name": f"Quill {case.text}"}
            )
            # When the worker has answered (and deleted the entry: it publishes first)
            await run.answered(entry)

            async def deleted() -> bool:
                return int(await run.client.xlen("gm:inbound")) == 0

            await run.until(deleted, "the answered entry deleted")
            # Then the model saw a name, with no piece of the secret in the request
            shown = endpoint.last_user("hello from Quill")["name"]
            assert shown.startswith("Quill") and OPENAI_NAME.fullmatch(shown)
            assert not leaks(case, b"".join(endpoint.raw).decode()), shown
            # And nothing of it is in Redis
            sync = _sync_client(run.client)
            try:
                stored = dump_all(sync)
            finally:
                sync.close()
            assert not leaks(case, stored) and "Quill_" not in stored
        await chat.aclose()

    caplog.set_level(logging.DEBUG, logger="gridmem")
    try:
        go(scenario())
    finally:
        endpoint.stop()
    # And no log line holds the name at all
    assert "Quill" not in caplog.text and not leaks(case, caplog.text)


def _sync_client(async_client: Any) -> Any:
    """A synchronous client of the same server, for tests.helpers.dump_all."""
    import fakeredis
    import redis as redis_py

    if isinstance(async_client, fakeredis.FakeAsyncRedis):
        kwargs = async_client.connection_pool.connection_kwargs
        return fakeredis.FakeRedis(server=kwargs["server"])
    kwargs = async_client.connection_pool.connection_kwargs
    return redis_py.Redis(unix_socket_path=kwargs["path"])
