"""Exact token counts offline (gridmem[tokens]) and the service's context budget (issue 17)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st
from tiktoken_ext import openai_public

from gridmem import AvatarMessage
from gridmem import Settings
from gridmem.budget import utf8_bytes
from gridmem.config import LlmSettings
from gridmem.errors import ConfigError
from gridmem.errors import InvalidInput
from gridmem.testing import fake_async_store
from gridmem.tokens import encoding_for_model
from gridmem.tokens import token_counter
from worker.llm import MESSAGE_OVERHEAD_TOKENS
from worker.llm import NAME_MAX_CHARS
from worker.llm import context_budget

# tiktoken's published SHA-256 of its BPE files (tiktoken_ext/openai_public.py, the
# files it downloads): what bpe-openai ships must be exactly these.
PUBLISHED_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
# tiktoken's own constructors (pattern and special tokens), fed the shipped data
CONSTRUCTORS = {"cl100k_base": openai_public.cl100k_base, "o200k_base": openai_public.o200k_base}


def _shipped(name: str) -> bytes:
    """The data file as installed, found without importing bpe_openai (its import warns)."""
    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    return gzip.decompress((package / "data" / f"{name}.tiktoken.gz").read_bytes())


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHA256))
def test_shipped_data_is_tiktokens_published_file(name: str) -> None:
    assert hashlib.sha256(_shipped(name)).hexdigest() == PUBLISHED_SHA256[name]


def _tiktoken(name: str) -> tiktoken.Encoding:
    """tiktoken itself, built offline from the shipped (hash-checked) data."""
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in _shipped(name).splitlines() if line)
    }
    # tiktoken's constructor, its downloader swapped for the shipped data
    download = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
    try:
        params: dict[str, Any] = CONSTRUCTORS[name]()
    finally:
        openai_public.load_tiktoken_bpe = download
    return tiktoken.Encoding(**params)


@pytest.fixture(scope="module")
def references() -> dict[str, tiktoken.Encoding]:
    return {name: _tiktoken(name) for name in PUBLISHED_SHA256}


_chat = st.text(
    st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc")), max_size=200
)


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHA256))
@given(text=_chat)
@example(text="")
@example(text="hello world, how are you?")
@example(text="你好\uff0c世界\uff01 🎉👩\u200d👩\u200d👧 ünïcødé")
@example(text="<|endoftext|> <|im_start|>system")
@example(text="A" * 1000)
@example(text=" \n\n\t   \r\n  x")
@example(text="sk-proj-" + "a1" * 40)
def test_exact_counts_match_tiktoken_and_bytes_never_undercount(
    references: dict[str, tiktoken.Encoding], name: str, text: str
) -> None:
    count = token_counter(name)
    exact = len(references[name].encode_ordinary(text))
    assert count(text) == exact
    assert utf8_bytes(text) >= exact  # the default counter is conservative


def test_model_names_map_to_their_encoding() -> None:
    assert encoding_for_model("gpt-4o-mini") == "o200k_base"
    assert encoding_for_model("gpt-4.1-nano") == "o200k_base"
    assert encoding_for_model("o3-mini") == "o200k_base"
    assert encoding_for_model("gpt-4") == "cl100k_base"
    assert encoding_for_model("gpt-3.5-turbo-16k") == "cl100k_base"
    assert encoding_for_model("llama-3") is None
    assert encoding_for_model("o10") is None
    with pytest.raises(InvalidInput, match="tokenizer"):
        token_counter("llama-3")


def test_exact_counter_needs_no_network(tmp_path: Any) -> None:
    """A fresh process with every socket refused and an empty cache still counts."""
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket.connect = refuse; socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from gridmem.tokens import token_counter\n"
        "print(token_counter('gpt-4o')('hello world'), token_counter('gpt-4')('hello world'))\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "TIKTOKEN_CACHE_DIR": str(tmp_path / "tk")}
    env.update(HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.split() == ["2", "2"]


# -- the service's budget: [llm] context_tokens, reply_tokens, tokenizer ---------------


def test_no_context_tokens_means_no_budget() -> None:
    budget = context_budget(LlmSettings())
    assert budget.max_tokens is None
    assert budget.count_tokens("abc") == 3 + MESSAGE_OVERHEAD_TOKENS


def test_budget_is_the_window_less_prompt_reply_and_name() -> None:
    prompt = "Be kind."  # 8 bytes
    settings = LlmSettings(context_tokens=4000, reply_tokens=500, system_prompt=prompt)
    budget = context_budget(settings)
    # window - (prompt + overhead) - reply - priming (3) - the name allowance
    assert budget.max_tokens == 4000 - (8 + MESSAGE_OVERHEAD_TOKENS) - 500 - 3 - NAME_MAX_CHARS


def test_exact_tokenizer_budget_counts_tokens() -> None:
    settings = LlmSettings(context_tokens=4000, reply_tokens=0, tokenizer="gpt-4o")
    budget = context_budget(settings)
    assert budget.count_tokens("hello world") == 2 + MESSAGE_OVERHEAD_TOKENS
    prompt_tokens = len(settings.system_prompt.split())  # about a token a word, not bytes
    assert budget.max_tokens is not None
    assert budget.max_tokens > 4000 - 2 * prompt_tokens - 100


def test_window_too_small_is_a_startup_error() -> None:
    with pytest.raises(ConfigError, match="context_tokens"):
        context_budget(LlmSettings(context_tokens=100, reply_tokens=10))
    with pytest.raises(ValueError, match="reply_tokens"):
        LlmSettings(context_tokens=100, reply_tokens=100)
    with pytest.raises(ValueError, match="tokenizer"):
        LlmSettings(tokenizer="sentencepiece")


class CapturingChat:
    """A ChatClient that keeps the messages it was sent."""

    name = "capturing"

    def __init__(self) -> None:
        self.sent: list[list[dict[str, str]]] = []

    async def complete(self, messages: list[dict[str, str]]) -> str:
        self.sent.append(messages)
        return "ok"

    async def aclose(self) -> None:
        return None


def test_the_worker_sends_a_context_sized_to_the_window() -> None:
    from worker.service import Worker

    resident = "0f5e3a3c-1b7e-4f61-9a39-6d2f2c1b9e11"
    # Given a worker for a 1,200-token window (bytes), 200 kept for the reply
    settings = Settings(llm={"context_tokens": 1200, "reply_tokens": 200, "system_prompt": "Hi."})
    budget = context_budget(settings.llm).max_tokens
    assert budget is not None

    async def scenario() -> list[dict[str, str]]:
        store, _ = fake_async_store(settings.conversation)
        chat = CapturingChat()
        worker = Worker(store, chat, settings, name="w-budget")
        # And a conversation of 40 turns of 50 bytes, far over the window
        for i in range(39):
            await store.record(resident, "im", AvatarMessage(text=f"{i:02d}" + "x" * 48))
        # the 40th arrives: the worker records it and reads the context in one call
        _, context = await store.record_and_context(
            resident,
            "im",
            AvatarMessage(text="39" + "x" * 48),
            max_tokens=worker.budget.max_tokens,
            count_tokens=worker.budget.count_tokens,
        )
        await worker._ask(context, None)
        await store.aclose()
        return chat.sent[0]

    sent = asyncio.run(scenario())
    # Then it sent its system prompt and the newest turns that fit the budget, in order
    system, *turns = sent
    assert system == {"role": "system", "content": "Hi."}
    per_turn = 50 + MESSAGE_OVERHEAD_TOKENS
    assert len(turns) == budget // per_turn < 40
    assert [t["content"][:2] for t in turns] == [f"{i:02d}" for i in range(40 - len(turns), 40)]
