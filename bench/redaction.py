"""Redaction throughput on chat, on secret-dense text and on hostile text.

    python bench/redaction.py [--size-mib 1] [--repeat 5]

Prints MB/s per corpus (best of --repeat runs, 1 MiB each by default), the
hostile/benign time ratio for each hostile corpus at the same size (target <= 3),
and the share of a `record()` call spent in redaction for chat-sized lines,
measured against a real Valkey started for the run (target: chat >= 20 MB/s).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker import AvatarMessage, ConversationStore
from worker.embedded import EmbeddedValkey
from worker.redaction import DEFAULT_REDACTOR, RULES

CHAT_LINES = [
    "hi! is the sandbox open today?",
    "where can I buy a boat in this region?",
    "see http://maps.secondlife.com/secondlife/Ahern/128/128/25 for the spot",
    "lol ok",
    "my key is 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90, add me",
    "the password for the club door is on the notecard",
    'llSetPos(<128, 128, 25>); llSay(0, "hello");',
    "check https://example.org/search?q=boats&page=2",
    "hop://grid.example.org:8002/Sandbox/128/128/25 is where we meet",
]


def corpus(lines: list[str], size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < size:
        line = rng.choice(lines)
        out.append(line)
        n += len(line) + 1
    return "\n".join(out)[:size]


def hostile(size: int) -> dict[str, str]:
    return {
        "runs of ://": "://" * (size // 3),
        "runs of =": "a=" * (size // 2),
        "runs of sk-": "sk-" * (size // 3),
        "nested brackets": "[(<{" * (size // 8) + "}>)]" * (size // 8),
        "near matches": corpus(
            ["sk-abc", "password ;", "http://h/cap/8a5e2c1b-0d6f", "ghp_", "eyJx.eyJ", "AKIA12",
             "$1$ab", "?token&key", "bearer x", "-----BEGIN PUBLIC KEY-----"], size),
        "unterminated private key": "-----BEGIN PRIVATE KEY-----" + "A" * size,
    }  # fmt: skip


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: plan compilation
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def record_share(repeat: int) -> tuple[float, float]:
    """(us per record() of a chat line, us of that spent redacting)."""
    lines = [line + f" #{i}" for i, line in enumerate(CHAT_LINES * 20)]
    directory = Path(tempfile.mkdtemp(prefix="gm-bench-", dir="/tmp"))
    try:
        with EmbeddedValkey(directory) as server:
            store = ConversationStore(server.client())
            avatar = "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90"

            def record_all() -> None:
                for line in lines:
                    store.record(avatar, "im", AvatarMessage(text=line))

            recording = best_seconds(record_all, repeat)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    redacting = best_seconds(lambda: [DEFAULT_REDACTOR.redact(line) for line in lines], repeat)
    return recording / len(lines) * 1e6, redacting / len(lines) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    size = int(args.size_mib * (1 << 20))

    chat = corpus(CHAT_LINES, size)
    dense = corpus([p for rule in RULES for p in rule.positives] + CHAT_LINES[:3], size)
    rows: list[tuple[str, float, int, str]] = []
    benign = best_seconds(lambda: DEFAULT_REDACTOR.redact(chat), args.repeat)
    rows.append(("chat (benign)", benign, DEFAULT_REDACTOR.redact(chat)[1], "target >= 20 MB/s"))
    dense_s = best_seconds(lambda: DEFAULT_REDACTOR.redact(dense), args.repeat)
    rows.append(("dense with secrets", dense_s, DEFAULT_REDACTOR.redact(dense)[1], ""))
    for name, text in hostile(size).items():
        seconds = best_seconds(lambda t=text: DEFAULT_REDACTOR.redact(t), args.repeat)  # type: ignore[misc]
        ratio = seconds / benign
        rows.append((f"hostile: {name}", seconds, DEFAULT_REDACTOR.redact(text)[1],
                     f"{ratio:.2f}x benign (target <= 3)"))  # fmt: skip

    print(f"\n{len(RULES)} rules, {size / (1 << 20):.2f} MiB per corpus, best of {args.repeat}\n")
    header = f"{'corpus':<34} {'MB/s':>9} {'ms':>8} {'redactions':>11}  note"
    print(header)
    print("-" * (len(header) + 24))
    for name, seconds, count, note in rows:
        print(f"{name:<34} {size / seconds / 1e6:>9.1f} {seconds * 1000:>8.2f} {count:>11}  {note}")
    per_record, per_redact = record_share(args.repeat)
    print(
        f"\nrecord() of a chat line: {per_record:.0f} us, of which redaction {per_redact:.1f} us "
        f"({per_redact / per_record:.1%})"
    )


if __name__ == "__main__":
    main()
