"""Inbound entries: what the worker accepts and the dead-letter code for what it refuses."""

from __future__ import annotations

import pytest

from worker.service import Rejected, check_inbound, decode_inbound

U = "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90"


def test_accepts_and_canonicalises() -> None:
    assert check_inbound(
        {"avatar_uuid": U.upper(), "channel": "im", "text": "hi", "avatar_name": "Ann"}, 100
    ) == (U, "im", "hi")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, "gone"),
        ({"avatar_uuid": U, "channel": "im", "text": "hi", "role": "system"}, "unknown_field"),
        ({"avatar_uuid": U, "channel": "im"}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "   "}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "\x01\x02\x7f\n"}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "\u200b\ufeff"}, "missing_text"),
        ({"avatar_uuid": U, "channel": "im", "text": "x" * 101}, "oversized"),
        ({"avatar_uuid": U, "channel": "im", "text": "é" * 51}, "oversized"),
        ({"avatar_uuid": "nope", "channel": "im", "text": "hi"}, "bad_uuid"),
        ({"channel": "im", "text": "hi"}, "bad_uuid"),
        ({"avatar_uuid": U, "channel": "group", "text": "hi"}, "bad_channel"),
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
    ],
)
def test_decode_rejections(raw: list[tuple[bytes, bytes]], reason: str) -> None:
    """Regression (issue 12): bytes that are not UTF-8, in any field, are a dead-letter
    reason of their own, not an error that stops the entry from ever being rejected."""
    with pytest.raises(Rejected) as caught:
        decode_inbound(raw, 100)
    assert caught.value.reason == reason
