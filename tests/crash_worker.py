"""A worker process that kills itself at a chosen step: for tests/test_worker_crash.py.

    python -m tests.crash_worker <redis url> <mode> <marker file>

Modes (SIGKILL, as the OOM killer would; nothing is cleaned up):
- llm: the model call for a text holding DEADLY kills the process, once two other
  calls are in flight (or after half a second alone); other calls take half a second.
- reject-before: the first rejection of an entry kills the process after the worker
  decided (its reason is written) and before the dead letter lands.
- reject-after: the first rejection kills the process after the dead letter landed,
  before the entry is finished.
The marker file makes the reject modes kill only once across restarts.
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
from gridmem.store import AsyncConversationStore, connect_async
from worker.llm import ChatClient, Message
from worker.service import Worker

SETTINGS = {
    "worker": {"concurrency": 4, "lease_seconds": 1, "max_attempts": 3},
    "conversation": {"limits": {"max_input_bytes": 4000, "max_text_bytes": 2000}},
}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DeadlyChat:
    name = "deadly"

    def __init__(self) -> None:
        self.others = 0

    async def complete(self, messages: list[Message]) -> str:
        last = [m["content"] for m in messages if m["role"] == "user"][-1]
        if "DEADLY" in last:
            for _ in range(50):  # bounded: alone, it kills after half a second
                if self.others >= 2:
                    break
                await asyncio.sleep(0.01)
            die()
        self.others += 1
        try:
            await asyncio.sleep(0.5)  # a model's thinking time
        finally:
            self.others -= 1
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
    chat: ChatClient = DeadlyChat() if mode == "llm" else PlainChat()
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

    async def dead_lettering(entry_id: str, reason: str, *, member: str) -> None:
        if mode == "reject-before" and first_time():
            die()
        await dead_letter(entry_id, reason, member=member)
        if mode == "reject-after" and reason != "poison" and first_time():
            die()

    worker._dead_letter = dead_lettering


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
