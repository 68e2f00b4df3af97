"""What the framework integrations' tests share (gridmem/integrations, issue 17).

The frameworks are optional extras. README's test command (the run CI makes of the
whole suite) installs them (`.[test,integrations]`) and there a missing one is an
error; .ci/run's fast suites on other Pythons (CI_SUBSET) install `.[test]` only,
and a developer may too: there the integration test modules are left out whole, at
collection (one "skipped" line per module, no test item, so no real-server test is
counted as skipped by the CI guard in tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import fakeredis
import pytest
import redis.asyncio as redis_async

from gridmem.store import connect_async
from tests.helpers import avatar
from tests.helpers import dump_all

# A pasted OpenAI-style key and a grid capability URL; their distinctive bodies
# (the test's own, not the redactor's) must never reach the server.
KEY_BODY = "T3stK3yB0dyZq8Vn5Lm2Xw9Rc4Hj7Pd1Fs6Gk0Ye"
SECRET_TEXT = (
    f"my key is sk-proj-{KEY_BODY} and my door "
    "http://sim.example.org:9000/CAPS/6f2c1a0e-2b1f-4e0a-9c1d-3e4f5a6b7c8d0000/"
)
SECRET_BODIES = (KEY_BODY, "6f2c1a0e-2b1f-4e0a-9c1d-3e4f5a6b7c8d0000")
ALICE, BOB = avatar(1701), avatar(1702)


# The frameworks tests/test_integration_*.py run against (gridmem[integrations]).
FRAMEWORKS = ("langchain_core", "llama_index.core", "agents")


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is not there either
        return False


def require(module: str) -> None:
    """Leave the calling test module out when the framework `module` is not installed,
    except in the run of the whole suite under CI=true, which must test it."""
    if installed(module):
        return
    if os.environ.get("CI") == "true" and not os.environ.get("CI_SUBSET"):
        raise ImportError(f"{module} is not installed: CI installs .[test,integrations]")
    pytest.skip(f"{module} not installed (extra gridmem[integrations])", allow_module_level=True)


def assert_no_secret(client: Any) -> None:
    """Every key and value in the server: no secret body anywhere."""
    everything = dump_all(client)
    assert everything, "the test stored nothing"
    for body in SECRET_BODIES:
        assert body not in everything


def async_twin(redis: Any, backend: str, real_servers: Any = None) -> redis_async.Redis:
    """An asyncio client of the test's server (built inside the running loop)."""
    if backend == "fake":
        return fakeredis.FakeAsyncRedis(server=redis.connection_pool.connection_kwargs["server"])
    return connect_async(real_servers[backend].url)
