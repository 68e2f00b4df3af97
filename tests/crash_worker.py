"""A worker process that kills itself at a chosen step: for tests/test_worker_crash.py.

    python -m tests.crash_worker <redis url> <mode> <marker file>

Modes (SIGKILL, as the OOM killer would; nothing is cleaned up):
- llm: the model call for a text holding DEADLY kills the process. In the worker's
  first life it waits until two other calls are in flight, and those stay in flight
  until it kills (the bystanders); in later lives it kills at once, and every other
  call is answered at once. Nothing waits on time.
- reject-before: the first rejection of an entry kills the process after the worker
  decided (its reason is written) and before the dead letter lands.
- reject-after: the first rejection kills the process after the dead letter landed,
  before the entry is finished.
The marker file makes the reject modes kill only once across restarts, and tells the
llm mode's first life from the later ones.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gridmem.clock import ManualClock
from gridmem.config import Settings
from gridmem.store import AsyncConversationStore
from gridmem.store import connect_async
from worker.llm import ChatClient
from worker.llm import Message
from worker.service import Worker

SETTINGS = {
    "worker": {"concurrency": 4, "lease_seconds": 1, "max_attempts": 3},
    "conversation": {"limits": {"max_input_bytes": 4000, "max_text_bytes": 2000}},
}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DeadlyChat:
    """The model: a text holding DEADLY kills the process.

    In the worker's first life (no marker yet) the deadly call waits until two other
    calls are in flight, and those wait with it: they are still in flight when it
    kills, the bystanders whose attempts the crash charges. In later lives (the
    deadly entry is then a suspect, run alone) it kills at once and every other call
    is answered at once.
    """

    name = "deadly"

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.first_life = not marker.exists()
        self.in_flight = 0
        self.changed = asyncio.Condition()

    async def complete(self, messages: list[Message]) -> str:
        last = [m["content"] for m in messages if m["role"] == "user"][-1]
        if "DEADLY" in last:
            if self.first_life:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.in_flight >= 2)
                self.marker.write_text("llm")
            die()
        if self.first_life:  # a bystander: in flight until the deadly call kills us all
            async with self.changed:
                self.in_flight += 1
                self.changed.notify_all()
            await asyncio.get_running_loop().create_future()  # never done: SIGKILL ends it
        return f"answered: {last}"

    async def aclose(self) -> None:
        return None


class PlainChat:
    name = "plain"

    async def complete(self, messages: list[Message]) -> str:
        return "ok"

    async def aclose(self) -> None:
        return None


async def main(url: str, mode: str, marker: Path) -> None:
    data: dict[str, Any] = {**SETTINGS}
    if mode.startswith("reject"):  # one attempt: before the fix, the adoption said poison
        data["worker"] = {**SETTINGS["worker"], "max_attempts": 1}
    settings = Settings.model_validate(data)
    store = AsyncConversationStore(connect_async(url), settings.conversation, clock=ManualClock())
    chat: ChatClient = DeadlyChat(marker) if mode == "llm" else PlainChat()
    worker = Worker(store, chat, settings)
    if mode.startswith("reject"):
        _arm(worker, mode, marker)
    try:
        await worker.run()
    finally:
        await store.aclose()


def _arm(worker: Any, mode: str, marker: Path) -> None:
    dead_letter = worker._dead_letter

    def first_time() -> bool:
        if marker.exists():
            return False
        marker.write_text(mode)
        return True

    async def dead_lettering(entry_id: str, reason: str, *, key: Any) -> None:
        if mode == "reject-before" and first_time():
            die()
        await dead_letter(entry_id, reason, key=key)
        if mode == "reject-after" and reason != "poison" and first_time():
            die()

    worker._dead_letter = dead_lettering


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
