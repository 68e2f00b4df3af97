"""gridmem.testing as a user meets it (issue 17 section 2).

Each test writes a user's own project (a conftest.py with the one line that
enables the plugin, a test file that imports only the public API and
gridmem.testing) and runs pytest on it, so the kit is checked the way its users
run it, fixtures and all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.fake

CONFTEST = 'pytest_plugins = ["gridmem.testing"]\n'
# Warnings are errors in the user's run too; but in this process gridmem.testing may
# be imported already (another test module imports it), which only costs pytest its
# assertion rewriting of the plugin's module: not the user's concern.
STRICT = ("-W", "error", "-W", "ignore::pytest.PytestAssertRewriteWarning")

USER_TESTS = """
import asyncio

import pytest

from gridmem import AgentReply, AvatarMessage, Channel, ConversationConfig, Limits
from gridmem.testing import advance_past_ttl, fake_async_store, fake_store, fill_session, ttl_ms

UUID = "0f5e3a3c-1b7e-4f61-9a39-6d2f2c1b9e11"


def test_store_and_clock_fixtures(gridmem_store, gridmem_clock):
    first = gridmem_store.record(UUID, Channel.PUBLIC, AvatarMessage(text="hi, my key is sk-proj-" + "a" * 40))
    gridmem_store.record(UUID, Channel.PUBLIC, AgentReply(text="hello!"))
    [said, reply] = gridmem_store.context(UUID, Channel.PUBLIC)
    assert "sk-proj-" not in said.content and first.redactions == 1
    assert reply.content == "hello!"
    # time is paused: nothing expires unless the test moves the clock
    gridmem_clock.advance(ttl_ms("public") - 1)
    assert not gridmem_store.record(UUID, "public", AvatarMessage(text="still here")).new_session


def test_advance_past_ttl_starts_a_new_session(gridmem_store, gridmem_clock):
    old = gridmem_store.record(UUID, "im", AvatarMessage(text="remember me"))
    advance_past_ttl(gridmem_clock, "im")
    new = gridmem_store.record(UUID, "im", AvatarMessage(text="again"))
    assert new.new_session and new.session_id != old.session_id
    assert [m.content for m in gridmem_store.context(UUID, "im")] == ["again"]


@pytest.fixture
def gridmem_config():
    return ConversationConfig(limits=Limits(max_turns_per_session=20))


def test_fill_session_to_its_bound(gridmem_store):
    receipts = fill_session(gridmem_store, UUID, "public")
    assert len(receipts) == 20 and len(gridmem_store.context(UUID, "public")) == 20
    gridmem_store.record(UUID, "public", AvatarMessage(text="one more"))
    [summary, *turns] = gridmem_store.context(UUID, "public")
    assert summary.content.startswith("[Summary") and len(turns) < 20
    # filling again counts the live turns, not the summary: back to exactly the bound
    fill_session(gridmem_store, UUID.upper(), "PUBLIC")
    [page] = gridmem_store.list_metadata().items
    assert page.turn_count == 20


def test_async_store_shares_the_server_and_clock(gridmem_store, gridmem_async_store):
    gridmem_store.record(UUID, "public", AvatarMessage(text="sync door"))

    async def read():
        return await gridmem_async_store.context(UUID, "public")

    assert [m.content for m in asyncio.run(read())] == ["sync door"]


def test_factories_without_pytest_fixtures():
    store, clock = fake_store()
    other, _ = fake_store()
    store.record(UUID, "public", AvatarMessage(text="mine"))
    assert other.context(UUID, "public") == []  # a fresh server each call

    async def run():
        door, _ = fake_async_store(clock=clock)
        await door.record(UUID, "public", AvatarMessage(text="async"))
        out = await door.context(UUID, "public")
        await door.aclose()
        return out

    assert [m.content for m in asyncio.run(run())] == ["async"]
"""


def test_a_users_suite_runs_green_with_the_plugin(pytester: pytest.Pytester) -> None:
    # Given a user's project with the one-line plugin and tests of their agent
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_agent=USER_TESTS)
    # When they run pytest
    result = pytester.runpytest_inprocess("-p", "no:randomly", *STRICT)
    # Then every one of their tests passes
    result.assert_outcomes(passed=5)


def test_a_wrong_expectation_fails_in_a_users_suite(pytester: pytest.Pytester) -> None:
    """The kit's clock really expires sessions: a test expecting the old session fails."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_wrong=textwrap.dedent(
            """
            from gridmem import AvatarMessage
            from gridmem.testing import advance_past_ttl

            def test_expects_continuity(gridmem_store, gridmem_clock):
                u = "0f5e3a3c-1b7e-4f61-9a39-6d2f2c1b9e11"
                gridmem_store.record(u, "public", AvatarMessage(text="a"))
                advance_past_ttl(gridmem_clock, "public")
                assert not gridmem_store.record(u, "public", AvatarMessage(text="b")).new_session
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:randomly", *STRICT)
    result.assert_outcomes(failed=1)


def test_core_import_pulls_in_no_test_package() -> None:
    """`import gridmem` (and the service's CLI) never loads fakeredis, pytest or hypothesis."""
    code = (
        "import sys, gridmem, gridmem.store, worker.cli; "
        "print(sorted(m for m in ('fakeredis', 'pytest', 'hypothesis', '_pytest') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
