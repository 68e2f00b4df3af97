"""Inbound entries: what the worker accepts and the dead-letter code for what it refuses."""

from __future__ import annotations

import pytest

from worker.inbound import Rejected
from worker.inbound import check_inbound
from worker.inbound import decode_inbound

U = "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90"

# Issue 12, second pass: texts a reader sees nothing of (each character listed by
# hand from Unicode's default-ignorable set, the controls and the blank look-alikes).
INVISIBLE_ONLY = [
    "\u200b\u200c\u200d",  # zero-width space, non-joiner, joiner
    "\u2060\u2061\u2064",  # word joiner, invisible operators
    "\ufeff\ufeff",  # BOM
    "\U000e0001\U000e0067\U000e0062\U000e007f",  # the tags block (tag characters)
    "\u202a\u202e\u2066\u2069\u200e\u200f\u061c",  # bidi controls and marks
    "\ufe0f\ufe00\U000e0100",  # variation selectors
    "\u034f\u180e\u00ad",  # combining grapheme joiner, Mongolian vowel separator, soft hyphen
    "\u3164\uffa0\u115f\u2800\u3000",  # Hangul fillers, braille blank, ideographic space
    "\x00\x01\x1b\x7f\x85\x9f",  # control characters only
    " \u200b\n\t\U000e0020 ",  # a mix with whitespace
]
VISIBLE_WITH_INVISIBLE = [
    "a\u200bb",
    "\U0001f469\u200d\U0001f4bb",
    "\u202eabc",
    "\U0001f3f4\U000e0067\U000e007f",
]


def test_accepts_and_canonicalises() -> None:
    assert check_inbound(
        {"avatar_uuid": U.upper(), "channel": "im", "text": "hi", "avatar_name": "Ann"}, 100
    ) == (U, "im", "hi")
    # a channel in any case, as a UUID (issue 13, item 11)
    for spelled, channel in (("IM", "im"), ("Im", "im"), ("PUBLIC", "public")):
        assert (
            check_inbound({"avatar_uuid": U, "channel": spelled, "text": "hi"}, 100)[1] == channel
        )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, "gone"),
        ({"avatar_uuid": U, "channel": "im", "text": "hi", "role": "system"}, "unknown_field"),
        ({"avatar_uuid": U, "channel": "im"}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "   "}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "\x01\x02\x7f\n"}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "\u200b\ufeff"}, "missing_text"),
        *(
            ({"avatar_uuid": U, "channel": "im", "text": text}, "missing_text")
            for text in INVISIBLE_ONLY
        ),
        ({"avatar_uuid": U, "channel": "im", "text": "x" * 101}, "oversized"),
        ({"avatar_uuid": U, "channel": "im", "text": "é" * 51}, "oversized"),
        ({"avatar_uuid": "nope", "channel": "im", "text": "hi"}, "bad_uuid"),
        ({"channel": "im", "text": "hi"}, "bad_uuid"),
        ({"avatar_uuid": U, "channel": "group", "text": "hi"}, "bad_channel"),
        ({"avatar_uuid": U, "channel": "im ", "text": "hi"}, "bad_channel"),
        ({"avatar_uuid": U, "channel": "\uff29\uff2d", "text": "hi"}, "bad_channel"),
    ],
)
def test_rejections(fields: dict[str, str], reason: str) -> None:
    with pytest.raises(Rejected) as caught:
        check_inbound(fields, 100)
    assert caught.value.reason == reason


def _raw(**fields: str | bytes) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in fields.items()]


def test_decode_gives_text_fields() -> None:
    raw = _raw(avatar_uuid=U, channel="im", text="héllo ✓", avatar_name="Ann")
    assert decode_inbound(raw, 100) == {
        "avatar_uuid": U,
        "channel": "im",
        "text": "héllo ✓",
        "avatar_name": "Ann",
    }


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([], "gone"),
        (_raw(avatar_uuid=U, channel="im", text=b"caf\xe9"), "bad_encoding"),
        (_raw(avatar_uuid=U, channel="im", text="hi", avatar_name=b"\xff"), "bad_encoding"),
        (_raw(avatar_uuid=U, channel="im", text=b"\xed\xa0\x80"), "bad_encoding"),  # surrogate
        (_raw(avatar_uuid=U, channel="im", text=b"\xf0\x9f\x98"), "bad_encoding"),  # cut short
        (_raw(avatar_uuid=U, channel="im", text=b"\xc0\xaf"), "bad_encoding"),  # overlong
        ([(b"\xfftext", b"hi"), (b"channel", b"im")], "bad_encoding"),  # a field's name
        (_raw(avatar_uuid=U, channel="im", text="x" * 101), "oversized"),
        (_raw(avatar_uuid=U, channel="im", text="hi", avatar_name=b"\xff" * 101), "oversized"),
        # a field named twice: the bad value before the good one is still seen
        ([(b"text", b"\xff"), *_raw(avatar_uuid=U, channel="im", text="hi")], "bad_encoding"),
        ([(b"text", b"x" * 101), *_raw(avatar_uuid=U, channel="im", text="hi")], "oversized"),
    ],
)
def test_decode_rejections(raw: list[tuple[bytes, bytes]], reason: str) -> None:
    """Regression (issue 12): bytes that are not UTF-8, in any field, are a dead-letter
    reason of their own, not an error that stops the entry from ever being rejected."""
    with pytest.raises(Rejected) as caught:
        decode_inbound(raw, 100)
    assert caught.value.reason == reason


@pytest.mark.parametrize("text", VISIBLE_WITH_INVISIBLE)
def test_visible_text_with_invisible_characters_is_accepted(text: str) -> None:
    """The other side: an emoji ZWJ sequence, a flag's tag sequence, a word with a ZWSP."""
    assert check_inbound({"avatar_uuid": U, "channel": "im", "text": text}, 100)[2] == text
