"""Redaction throughput on benign chat, on secret-dense text and on hostile text.

    python bench/redaction.py [--size-mib 1] [--repeat 5] [--no-record]

Prints, per corpus (1 MiB each by default, best of --repeat runs, all measured in
one run): MB/s, the time ratio to benign chat of the same size, and the number of
redactions; then the worst hostile ratio (target: every hostile corpus <= 5x
benign), and the share of a `record()` call spent in redaction for chat-sized
lines, measured against a real Valkey started for the run.
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

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem.embedded import EmbeddedValkey
from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.redaction import RULES

CHAT_LINES = [
    "hi! is the sandbox open today?",
    "where can I buy a boat in this region?",
    "see http://maps.secondlife.com/secondlife/Ahern/128/128/25 for the spot",
    "lol ok \U0001f468\u200d\U0001f469\u200d\U0001f467 family photo time",
    "parade at noon \U0001f3f3\ufe0f\u200d\U0001f308 \U0001f389\U0001f389",
    "my key is 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90, add me",
    "the password for the club door is on the notecard",
    'llSetPos(<128, 128, 25>); llSay(0, "hello");',
    "check https://example.org/search?q=boats&page=2",
    "hop://grid.example.org:8002/Sandbox/128/128/25 is where we meet",
]
LSL_LINES = [
    "key owner_key = llGetOwner();",
    "key target_key = NULL_KEY;",
    "integer pass = TRUE;",
    'llSetText("Pass: " + (string)n, <1,1,1>, 1.0);',
    'string token_name = "Gold Coin";',
    'default { state_entry() { llListen(0, "", NULL_KEY, ""); } }',
    'llHTTPRequest(url, [HTTP_METHOD, "POST"], llList2Json(JSON_OBJECT, ["q", msg]));',
]
MIXED_LINES = [
    "Привет, где песочница? 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
    "مرحبا، أين صندوق الرمل؟ \u200fok\u200f",
    "\u7802\u5834\u306f\u3069\u3053\u3067\u3059\u304b\uff1f\u3000\uff48\uff45\uff4c\uff4c\uff4f \uff12\uff10\uff12\uff14\u5e74",
    "Il a dit\u00a0: «\u00a0bonjour\u00a0» et puis\u202f!",
    "\u0646\u0635 \u0639\u0631\u0628\u064a with English and \u4e2d\u6587\uff0c\u6df7\u5408 \U0001f600 ok",
    "\uff26\uff55\uff4c\uff4c\uff0d\uff57\uff49\uff44\uff54\uff48 \uff43\uff48\uff41\uff54\uff1a\uff48\uff49\uff01",
]


def corpus(lines: list[str], size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < size:
        line = rng.choice(lines)
        out.append(line)
        n += len(line.encode("utf-8")) + 1
    return "\n".join(out)


def repeat(unit: str, size: int) -> str:
    return unit * (size // len(unit.encode("utf-8")) + 1)


def invisible(size: int, count: int = 10_000, seed: int = 2) -> str:
    """Benign chat with `count` invisible characters inside its words."""
    rng = random.Random(seed)
    chars = list(corpus(CHAT_LINES[:3] + CHAT_LINES[5:], size - 3 * count))
    marks = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"]
    for at in sorted(rng.sample(range(len(chars)), count), reverse=True):
        chars.insert(at, rng.choice(marks))
    return "".join(chars)


def hostile(size: int) -> dict[str, str]:
    return {
        "token: ": repeat("token: ", size),
        "?token=a&": repeat("?token=a&", size),
        "://a:b@": repeat("://a:b@", size),
        "password=": repeat("password=", size),
        '"password":"': repeat('"password":"', size),
        '\\"': repeat('\\"', size),
        "-----BEGIN PRIVATE KEY----- repeated": repeat("-----BEGIN PRIVATE KEY-----", size),
        "unterminated private key": "-----BEGIN PRIVATE KEY-----" + "A" * size,
        "10k invisible chars": invisible(size),
        "mixed-script text": corpus(MIXED_LINES, size),
        "runs of sk-": repeat("sk-", size),
        "percent escapes %41x": repeat("%41x", size),
        "json escapes \\u0070": repeat("\\u0070", size),
        "html entities &quot;": repeat("&quot;", size),
        "escaped names %70assword=": repeat("%70assword=ab%3D1 ", size),
        "look-alike names p\u0430ssword=": repeat("p\u0430ssword=x1 ", size),
        "russian chat": corpus(["Привет, где песочница? Ключ к успеху: терпение",
                                "\u0422\u041e\u041a\u0415\u041d игры: золото, пароль не скажу"], size),
        "nested brackets": "[(<{" * (size // 8) + "}>)]" * (size // 8),
        "near matches": corpus(
            ["sk-abc", "password ;", "http://h/cap/8a5e2c1b-0d6f", "ghp_", "eyJx.eyJ", "AKIA12",
             "$1$ab", "?token&key", "bearer x", "-----BEGIN PUBLIC KEY-----"], size),
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
    parser.add_argument("--no-record", action="store_true", help="skip the record() share")
    args = parser.parse_args()
    size = int(args.size_mib * (1 << 20))

    def run(text: str) -> tuple[float, int]:
        return best_seconds(lambda: DEFAULT_REDACTOR.redact(text), args.repeat), len(
            text.encode("utf-8")
        )

    benign = {
        "chat with emoji (benign)": corpus(CHAT_LINES, size),
        "LSL without secrets (benign)": corpus(LSL_LINES, size),
        "dense with secrets": corpus([p for rule in RULES for p in rule.positives], size),
    }
    rows: list[tuple[str, float, int, int, bool]] = []
    for name, text in benign.items():
        seconds, nbytes = run(text)
        rows.append((name, seconds, nbytes, DEFAULT_REDACTOR.redact(text)[1], False))
    for name, text in hostile(size).items():
        seconds, nbytes = run(text)
        rows.append((f"hostile: {name}", seconds, nbytes, DEFAULT_REDACTOR.redact(text)[1], True))

    # the ratio compares seconds per byte, so corpora a few bytes apart compare fairly
    base = rows[0][1] / rows[0][2]
    print(f"\n{len(RULES)} rules, ~{size / (1 << 20):.2f} MiB per corpus, best of {args.repeat}\n")
    header = f"{'corpus':<40} {'MB/s':>8} {'ms':>8} {'x benign':>9} {'redactions':>11}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name, seconds, nbytes, count, is_hostile in rows:
        ratio = seconds / nbytes / base
        if is_hostile:
            worst = max(worst, ratio)
        print(
            f"{name:<40} {nbytes / seconds / 1e6:>8.1f} {seconds * 1000:>8.2f} {ratio:>8.2f}x {count:>11}"
        )
    verdict = "ok" if worst <= 5 else "OVER TARGET"
    print(f"\nworst hostile ratio: {worst:.2f}x benign (target <= 5x): {verdict}")
    if not args.no_record:
        per_record, per_redact = record_share(args.repeat)
        print(
            f"\nrecord() of a chat line: {per_record:.0f} us, of which redaction {per_redact:.1f} us "
            f"({per_redact / per_record:.1%})"
        )


if __name__ == "__main__":
    main()
