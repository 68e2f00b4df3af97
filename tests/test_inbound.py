"""Inbound entries: what the worker accepts and the dead-letter code for what it refuses."""

from __future__ import annotations

import pytest

from worker.service import Rejected, check_inbound

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
