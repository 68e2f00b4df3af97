"""README.md's Python examples run as written.

Every ```python block compiles. Those that need a server on localhost run here
against fakeredis, by substituting the client they build and nothing else; the
one that builds from settings starts a private server, which
tests/test_serve_defaults.py covers, so it is compiled only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)

# What each example connects to, and the in-process stand-in it gets here.
SERVERS = {
    "redis.Redis()": "fakeredis.FakeRedis()",
    'connect_async("redis://localhost:6379")': "fakeredis.FakeAsyncRedis()",
}
COMPILED_ONLY = "from_config("


def test_readme_has_the_examples() -> None:
    assert len(BLOCKS) >= 3
    assert any("AsyncConversationStore" in block for block in BLOCKS)


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_readme_example_runs(number: int) -> None:
    block = BLOCKS[number]
    compile(block, f"README.md python block {number + 1}", "exec")
    if COMPILED_ONLY in block:
        return
    namespace: dict[str, object] = {"__name__": "readme_example"}
    if not any(server in block for server in SERVERS):
        # a fragment (the tools example of the service section) goes on from the first
        # example's `store` and `resident`
        assert number > 0, "the first example names the server it needs"
        _run(BLOCKS[0], namespace, 0)
    _run(block, namespace, number)


def _run(block: str, namespace: dict[str, object], number: int) -> None:
    for server, stand_in in SERVERS.items():
        block = block.replace(server, stand_in)
    code = compile("import fakeredis\n" + block, f"README.md python block {number + 1}", "exec")
    exec(code, namespace)


def test_readme_shows_records_with_keyword_arguments() -> None:
    """Records are pydantic models: `AvatarMessage("hi")` is a TypeError, so prose says text=."""
    positional = re.findall(
        r"\b(?:AvatarMessage|AgentReply|ToolSummary|ActionResult)\((?![a-z_]+=)[^)]",
        README.read_text(encoding="utf-8"),
    )
    assert positional == []
