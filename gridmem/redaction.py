"""Secret and capability-URL redaction, before anything is sent to Redis.

Residents paste capability URLs, login hashes, API keys and passwords into chat,
and tools return URLs with tokens. Every text field passes through `redact()`
before it is encoded, so no secret is ever an argument of a Redis command.

The rules live in gridmem/redaction_rules.py. This module owns how they run:

- A text holding escapes (`\u0070`, `%70`, `&#112;`) is also read as what they
  stand for, and a secret either reading finds goes (both are scanned, so a
  decoded `%7d` inside a password cannot end it early).
- Detection runs on a *normalized view* of the text: invisible format characters
  are dropped (a zero-width space inside a token), full-width and other
  compatibility forms are folded to ASCII (NFKC, per character), and Unicode
  spaces become ' '. A map from the view back to the
  original turns each match into a span of the ORIGINAL text, and that span is
  replaced: nothing of a secret survives, its invisible characters included.
  ASCII text skips the view; other text pays one RE2 scan, and the map is built
  only for a text with a match.
- All patterns run in google-re2, a linear-time engine, as one leftmost-first
  alternation of the rules the keyword pre-filter woke.
- Text so dense with matches that handling each one would cost far more than
  scanning (a megabyte of `?token=a&`) is cut short: after a budget of matches
  proportional to its length, the rest of the text from the next match on becomes
  one marker. Nothing secret survives, and the time stays linear in the length.
- The result is a fixed point: `redact(redact(x)[0])[0] == redact(x)[0]`. A
  match whose secret is already a marker changes nothing, no value a rule takes
  can start or end inside a marker, and a text that had matches is checked by
  another pass (a marker can complete a match around it: a UUID glued to a
  token ends at a word boundary once the token is a marker).
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

import re2

from gridmem.redaction_rules import ANY_NAME
from gridmem.redaction_rules import GRID_NEGATIVES
from gridmem.redaction_rules import LOOSE_NAME
from gridmem.redaction_rules import RULES
from gridmem.redaction_rules import SHORT_NAME
from gridmem.redaction_rules import Rule

__all__ = ["DEFAULT_REDACTOR", "GRID_NEGATIVES", "RULES", "Redactor", "Rule", "normalize", "redact"]

# -- the normalized view ---------------------------------------------------------------


# Invisible characters that are not category Cf: soft hyphen, Mongolian vowel
# separator, combining grapheme joiner, variation selectors (U+FE00-FE0F,
# U+E0100-E01EF), Hangul fillers, Khmer inherent vowels. Dropped like Cf.
_INVISIBLE = frozenset(
    [
        *(0x00AD, 0x180E, 0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x17B4, 0x17B5),
        *range(0xFE00, 0xFE10),
        *range(0xE0100, 0xE01F0),
    ]
)
# Look-alike punctuation NFKC keeps: hyphens and dashes, ratio and modifier colons,
# the ideographic full stop. Folded to ASCII so `sk\u2011proj\u2011...` is a key.
_LOOKALIKES = {
    **dict.fromkeys((0x2010, 0x2011, 0x2012, 0x2013, 0x2014, 0x2015, 0x2212, 0xFE58), "-"),
    **dict.fromkeys((0x2236, 0xA789, 0x02D0), ":"),
    0x3002: ".",
    0xFF61: ".",
}


def _is_combining_mark(cp: int) -> bool:
    """Latin combining diacritics (U+0300-036F and their supplements): a mark glued
    into a name (`pass\u0300word`) is dropped from the view."""
    return (
        0x0300 <= cp <= 0x036F
        or 0x1AB0 <= cp <= 0x1AFF
        or 0x1DC0 <= cp <= 0x1DFF
        or 0x20D0 <= cp <= 0x20FF
        or 0xFE20 <= cp <= 0xFE2F
    )


def _is_selector(cp: int) -> bool:
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF


def _tables() -> tuple[dict[int, str | None], list[int], list[int]]:
    """(translate table, format characters, characters folded to ASCII or a space)."""
    table: dict[int, str | None] = {}
    fmt: list[int] = []
    fold: list[int] = []
    for block in (range(0x80, 0x30000), range(0xE0000, 0xE1000)):
        for cp in block:
            ch = chr(cp)
            category = unicodedata.category(ch)
            if category == "Cf" or cp in _INVISIBLE or _is_combining_mark(cp):
                table[cp] = None
                fmt.append(cp)
            elif cp in _LOOKALIKES:
                table[cp] = _LOOKALIKES[cp]
                fold.append(cp)
            elif category in ("Zs", "Zl", "Zp"):
                table[cp] = " "  # NBSP, U+2000-200A, U+3000...: a space to every rule
                fold.append(cp)
            else:
                folded = unicodedata.normalize("NFKC", ch)
                if folded != ch and folded.isascii() and folded.isprintable():
                    table[cp] = folded
                    fold.append(cp)
    return table, fmt, fold


def _re2_class(points: list[int]) -> str:
    """An RE2 character-class body for sorted code points, as compact ranges."""
    parts: list[str] = []
    start = prev = -2
    for cp in [*points, -10]:
        if cp == prev + 1:
            prev = cp
            continue
        if start >= 0:
            parts.append(
                f"\\x{{{start:x}}}" if start == prev else f"\\x{{{start:x}}}-\\x{{{prev:x}}}"
            )
        start = prev = cp
    return "".join(parts)


_TABLE, _FMT_POINTS, _FOLD_POINTS = _tables()


# Characters the view changes, as UTF-8: what each becomes, and its byte length.
_SEQUENCES = tuple(chr(cp).encode("utf-8") for cp in sorted(_TABLE))
_FOLDED = {chr(cp).encode("utf-8"): (_TABLE[cp] or "").encode("utf-8") for cp in _TABLE}
_CHARS = {sequence: sequence.decode("utf-8") for sequence in _FOLDED}
_FOLDED_TEXT = {sequence: folded.decode("ascii") for sequence, folded in _FOLDED.items()}

# Cyrillic, Greek and Latin letters that look like ASCII ones and that NFKC keeps
# (`p\u0430ssword` with a Cyrillic a, `t\u03bfken` with a Greek omicron). Honest
# Russian or Greek text is full of them, so they are folded only when the text holds
# a secret word spelled with them (`_SPOOF_ENTRIES`), never merely because they occur.
_CONFUSABLES: dict[str, str] = {
    **dict(
        zip(
            "\u0430\u0432\u0435\u043a\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u0501\u051b\u051d\u04bb\u04cf",
            "abekopcyxsijdqwhl",
            strict=False,
        )
    ),
    **dict(
        zip(
            "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u0423\u0405\u0406\u0408\u051a\u051c",
            "ABEKMHOPCTXYSIJQW",
            strict=False,
        )
    ),
    **dict(
        zip("\u03b1\u03bf\u03c1\u03bd\u03b9\u03ba\u03c4\u03c5\u03c7", "aopviktux", strict=False)
    ),
    **dict(
        zip(
            "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a7\u03a5",
            "ABEZHIKMNOPTXY",
            strict=False,
        )
    ),
    **dict(zip("\u0131\u0237\u0251\u0261\u0585\u057d", "ijagou", strict=False)),
}
for _char, _ascii in _CONFUSABLES.items():
    _sequence = _char.encode("utf-8")
    _FOLDED[_sequence], _CHARS[_sequence], _FOLDED_TEXT[_sequence] = _ascii.encode(), _char, _ascii


def _spoof_entries(words: Iterable[str]) -> tuple[str, ...]:
    """RE2 set entries matching each word with any of its letters a look-alike."""
    look: dict[str, str] = {}
    for char, ascii_char in _CONFUSABLES.items():
        look[ascii_char.lower()] = look.get(ascii_char.lower(), "") + char
    entries = []
    for word in words:
        if not any(c in look for c in word.lower()):
            continue
        parts = []
        for c in word.lower():
            if c in look:
                parts.append("[" + c + c.upper() + look[c] + look.get(c.upper().lower(), "") + "]")
            else:
                parts.append("(?i:" + re2.escape(c) + ")")
        entries.append("".join(parts))
    return tuple(entries)


# Changes mapped one by one: a base plus one per this many bytes. Past it, the rest
# of the text maps as one piece, so a match in it is redacted to the end of the text
# (nothing leaks; only text stuffed with invisible characters loses precision).
CHANGE_BUDGET_BASE = 256
CHANGE_BUDGET_BYTES = 32


def _change_entries() -> tuple[str, ...]:
    """RE2 set entries, one per changed character, that match where the view changes
    the text in a way a rule could see. A foldable letter or digit matches anywhere
    (a full-width token among CJK text); a format character, a Unicode space or
    foldable punctuation only next to ASCII or another changed character. So an emoji's zero-width
    joiner (between two emoji) and a CJK full-width comma (between two ideographs)
    match none, and honest non-Latin text keeps the one-scan path."""
    # every changed character counts as a neighbour: a chain of them (spaces,
    # format characters, full-width punctuation) is folded whole once one of its
    # characters touches ASCII
    # (a variation selector only counts next to ASCII: an emoji's U+FE0F next to its
    # zero-width joiner is honest text)
    selectors = [cp for cp in _FMT_POINTS if _is_selector(cp)]
    chained = sorted(cp for cp in _FMT_POINTS + _FOLD_POINTS if not _is_selector(cp))
    near = r"[\t\n\r\x20-\x7e" + _re2_class(chained) + "]"
    ascii_near = r"[\t\n\r\x20-\x7e]"
    entries = []
    for sequence in _SEQUENCES:
        folded = _FOLDED[sequence].decode("ascii")
        char = re2.escape(sequence.decode("utf-8"))
        side = ascii_near if ord(sequence.decode("utf-8")) in selectors else near
        entries.append(char if folded.isalnum() else f"{side}{char}|{char}{side}")
    return tuple(entries)


_CHANGE_ENTRIES = _change_entries()


@functools.lru_cache(maxsize=256)
def _occurrence_pattern(present: tuple[bytes, ...]) -> re.Pattern[bytes]:
    return re.compile(b"|".join(re.escape(sequence) for sequence in present))


class _View:
    """The normalized view of a text as UTF-8 bytes, and its map back to the original's.

    Building it is C-speed work: one RE2 set scan says which changed characters
    occur (ASCII text skips even that), and one `str.replace` per distinct
    character makes the view. The map (where each change sits) is built only when
    a rule matches, in one `re` scan over the changes.
    """

    __slots__ = (
        "_norm_ends",
        "_norm_starts",
        "_orig_ends",
        "_orig_starts",
        "_present",
        "data",
        "norm",
    )

    def __init__(self, data: bytes, present: tuple[bytes, ...] = (), text: str = "") -> None:
        self.data = data
        self.norm = data
        self._present = present
        self._norm_starts: list[int] = []
        self._norm_ends: list[int] = []
        self._orig_starts: list[int] = []
        self._orig_ends: list[int] = []
        if present:
            # one str.replace per distinct character: a fast single-character search
            # over the decoded text (bytes.replace is slow over CJK, translate per char)
            for sequence in present:
                text = text.replace(_CHARS[sequence], _FOLDED_TEXT[sequence])
            self.norm = text.encode("utf-8")

    @property
    def mapped(self) -> bool:
        return bool(self._present)

    def build_map(self) -> None:
        """Where each change sits, in the original and in the view (once, on demand)."""
        if self._orig_starts or not self._present:
            return
        data = self.data
        budget = CHANGE_BUDGET_BASE + len(data) // CHANGE_BUDGET_BYTES
        orig_starts, orig_ends = self._orig_starts, self._orig_ends
        norm_starts, norm_ends = self._norm_starts, self._norm_ends
        norm = done = 0
        for found in _occurrence_pattern(self._present).finditer(data):
            start, end = found.span()
            budget -= 1
            folded = (
                len(_FOLDED[found.group()])
                if budget >= 0
                else len(self.norm) - norm - (start - done)
            )
            if budget < 0:
                end = len(data)  # the rest maps as one piece
            norm += start - done
            orig_starts.append(start)
            norm_starts.append(norm)
            norm += folded
            orig_ends.append(end)
            norm_ends.append(norm)
            done = end
            if budget < 0:
                break

    def start(self, pos: int) -> int:
        """Original byte offset of view offset `pos` taken as a span's start."""
        k = bisect.bisect_right(self._norm_starts, pos) - 1
        if k < 0:
            return pos
        if pos < self._norm_ends[k]:
            return self._orig_starts[k]  # inside a folded character: from its start
        return self._orig_ends[k] + pos - self._norm_ends[k]

    def end(self, pos: int) -> int:
        """Original byte offset of view offset `pos` taken as a span's (exclusive) end."""
        k = bisect.bisect_left(self._norm_starts, pos) - 1
        if k < 0:
            return pos
        if pos <= self._norm_ends[k]:
            return self._orig_ends[k]  # inside or at the end of a folded character: to its end
        return self._orig_ends[k] + pos - self._norm_ends[k]


# -- escapes: what a text stands for -------------------------------------------------------

# JSON and JS `\u0070` and `\x70` (up to 8 backslashes: double-escaped JSON), percent
# encoding `%70` and double `%2570`, HTML character references `&#112;` `&#x70;` `&quot;`.
# Each stands for one character; detection reads that character. Only what decodes to
# printable ASCII, an invisible character or a look-alike letter is decoded.
_ESCAPE = re.compile(
    rb"\\{1,8}u([0-9A-Fa-f]{4})|\\{1,8}x([2-7][0-9A-Fa-f])|%(?:25)?([2-7][0-9A-Fa-f])"
    rb"|&#0{0,4}(\d{2,3});|&#[xX]0{0,4}([0-9A-Fa-f]{2});|&(quot|apos|amp|lt|gt);"
)
_ENTITIES = {b"quot": b'"', b"apos": b"'", b"amp": b"&", b"lt": b"<", b"gt": b">"}
# Escapes mapped one by one: a base plus one per this many bytes (as CHANGE_BUDGET_*).
ESCAPE_BUDGET_BASE = 256
ESCAPE_BUDGET_BYTES = 32


@functools.lru_cache(maxsize=4096)
def _unescape(escape: bytes) -> bytes:
    """What one escape stands for, or the escape itself when it is left as it is."""
    found = _ESCAPE.fullmatch(escape)
    assert found is not None
    uni, hex_x, pct, dec, hex_ref, entity = found.groups()
    if entity is not None:
        return _ENTITIES[entity]
    cp = int(uni or hex_x or pct or hex_ref or b"0", 16) if dec is None else int(dec)
    if 0x20 <= cp < 0x7F:
        return bytes([cp])
    char = chr(cp)
    if cp in _TABLE:  # invisible, full-width, a Unicode space
        return (_TABLE[cp] or "").encode("ascii")
    if char in _CONFUSABLES:
        return _CONFUSABLES[char].encode("ascii")
    return escape


def _may_escape(text: str) -> bool:
    """A cheap test before the escape scan: plain chat (a URL's `&page=2` included)
    holds no `\\`, `%` or character reference and skips it."""
    return (
        "\\" in text
        or "%" in text
        or ("&" in text and any(ref in text for ref in _REFERENCE_STARTS))
    )


_REFERENCE_STARTS = ("&#", "&quot;", "&apos;", "&amp;", "&lt;", "&gt;")


class _Decoded:
    """A text with its escapes decoded (detection's input), and the map back.

    The decoded text is built in one `re.sub`; the map only when a rule matches,
    within a budget of escapes past which the rest of the text maps as one piece
    (a match there is redacted to the end of the text: nothing leaks).
    """

    __slots__ = ("_ends", "_norm_ends", "_norm_starts", "_starts", "data", "decoded")

    def __init__(self, data: bytes, decoded: bytes) -> None:
        self.data, self.decoded = data, decoded
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._norm_starts: list[int] = []
        self._norm_ends: list[int] = []

    @classmethod
    def of(cls, data: bytes) -> _Decoded | None:
        decoded = _ESCAPE.sub(lambda found: _unescape(found[0]), data)
        return None if decoded == data else cls(data, decoded)

    def build_map(self) -> None:
        if self._starts:
            return
        budget = ESCAPE_BUDGET_BASE + len(self.data) // ESCAPE_BUDGET_BYTES
        norm = done = 0
        for found in _ESCAPE.finditer(self.data):
            start, end = found.span()
            folded = _unescape(found[0])
            if folded == found[0]:
                continue
            budget -= 1
            norm += start - done
            if budget < 0:
                self._starts.append(start)
                self._norm_starts.append(norm)
                self._ends.append(len(self.data))
                self._norm_ends.append(len(self.decoded))
                return
            self._starts.append(start)
            self._norm_starts.append(norm)
            norm += len(folded)
            self._ends.append(end)
            self._norm_ends.append(norm)
            done = end

    def start(self, pos: int) -> int:
        k = bisect.bisect_right(self._norm_starts, pos) - 1
        if k < 0:
            return pos
        if pos < self._norm_ends[k]:
            return self._starts[k]
        return self._ends[k] + pos - self._norm_ends[k]

    def end(self, pos: int) -> int:
        k = bisect.bisect_left(self._norm_starts, pos) - 1
        if k < 0:
            return pos
        if pos <= self._norm_ends[k]:
            return self._ends[k]
        return self._ends[k] + pos - self._norm_ends[k]


class _DecodedView:
    """The character view of a decoded text, mapped back through both steps."""

    __slots__ = ("_decoded", "_inner", "data", "norm")

    def __init__(self, decoded: _Decoded, inner: _View) -> None:
        self._decoded, self._inner = decoded, inner
        self.data, self.norm = decoded.data, inner.norm

    mapped = True

    def build_map(self) -> None:
        self._decoded.build_map()
        self._inner.build_map()

    def start(self, pos: int) -> int:
        inner = self._inner.start(pos) if self._inner.mapped else pos
        return self._decoded.start(inner)

    def end(self, pos: int) -> int:
        inner = self._inner.end(pos) if self._inner.mapped else pos
        return self._decoded.end(inner)


def normalize(text: str) -> str:
    """The view detection runs on (for tests and rule authoring)."""
    return DEFAULT_REDACTOR._view(text)[0].norm.decode("utf-8")


# -- matching ---------------------------------------------------------------------------

# A match longer than this is replaced whole, without locating its secret part:
# capture extraction on a long span would run RE2's slower NFA over it.
SMALL_MATCH = 4096

# A generic rule's secret can be the first word of a longer, more specific secret:
# `token = -----BEGIN PGP PRIVATE KEY BLOCK-----...`, `auth_token: Bearer eyJ...`.
# After a secret this short that follows readable text (a name, a host), the scan
# resumes at the secret rather than after it, so the longer match is found too,
# and redact() replaces both with the first one's marker. Only short ones:
# resuming inside every secret could rescan a long one once per match within it
# (quadratic); a short one adds at most its own length to the scan.
SHORT_SECRET = 32

# A secret can hide the start of another match that runs past its end (a header
# value up to where a PEM block begins, a token glued to the next one). The last
# this many bytes of a secret are searched again for such a match: bounded extra
# work per match.
CROSS_WINDOW = 256

# Matches handled one by one: a base, plus one per this many bytes of text. Past it
# the text is match-dense far beyond any honest message, and the rest of it, from
# the next match, becomes one marker (bounded work per byte, nothing leaks).
MATCH_BUDGET_BASE = 64
MATCH_BUDGET_BYTES = 1024

# Passes after the first, for a text whose markers complete a match around them.
SETTLE_ROUNDS = 2

_MARKER = re.compile(rb"(?:\[REDACTED:[a-z0-9\-]+\][ \t]*)+")


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = 64 << 20  # room for the DFA on hostile input: it stays on the fast path
    return options


# The same escapes, for a linear-time check that a text holds any (most hold none).
_ESCAPE_PRESENT = re2.compile(_ESCAPE.pattern.replace(rb"\d", rb"[0-9]"), _options())


# google-re2's Pythonic wrapper builds a generator and a Match object per call;
# the hot loops below call the underlying RE2 object, which returns spans directly.
_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED
_ANCHOR_START = re2._re2.RE2.Anchor.ANCHOR_START
Spans = list[tuple[int, int]]
_SECRET_GROUP = re.compile(r"\(\?P<(secret\w*)>")


def _compile(pattern: str) -> Any:
    """A raw RE2 over UTF-8 bytes (compiled and checked by the public API)."""
    return re2.compile(pattern.encode("utf-8"), _options())._regexp


def _alternation(rules: tuple[Rule, ...], *, capture: bool) -> Any:
    """All rules as one leftmost-first alternation.

    With `capture`, group r<i> is rule i and v<i>_<name> its secret parts; without,
    the pattern has no groups at all, so RE2 finds spans with its DFAs alone.
    """
    parts = []
    for i, rule in enumerate(rules):
        if capture:
            pattern = _SECRET_GROUP.sub(f"(?P<v{i}_\\1>", rule.pattern)
            parts.append(f"(?P<r{i}>{pattern})")
        else:
            parts.append("(?:" + _SECRET_GROUP.sub("(?:", rule.pattern) + ")")
    return _compile("|".join(parts))


def _single_groups(rule: Rule) -> tuple[Any, tuple[int, ...]]:
    """One rule's pattern with its secret groups, and the numbers of those groups."""
    single = _alternation((rule,), capture=True)
    names = {
        (k.decode() if isinstance(k, bytes) else k): v for k, v in single.NamedCapturingGroups()
    }
    return single, tuple(v for k, v in sorted(names.items()) if k.startswith("v0_"))


def _marker(rule: Rule) -> bytes:
    return f"[REDACTED:{rule.id}]".encode("ascii")


# Values after a secret name that are not secrets (docs/redaction.md, "Value shapes"):
# placeholders and states, masks, variable references, L$ amounts and rates, sizes.
_HONEST_VALUE = re.compile(
    rb"(?i:required|optional|pending|none|null|nil|empty|unset|hidden|redacted|masked|"
    rb"top-secret|n/a|tbd|todo|unknown|invalid|expired|missing|granted|denied|revoked|"
    rb"approved|rejected|disabled|enabled)"
    rb"|(?:\*|\xe2\x80\xa2)+|x{3,}|X{3,}"  # a mask
    rb"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%"  # $DB_PASSWORD, ${X}, %X%
    rb"|[+\-]\d[\d,.]*(?:L\$)?(?:/[A-Za-z]+)?|L\$\d[\d,.]*|\d[\d,.]*L\$(?:/[A-Za-z]+)?"
    rb"|\d[\d,.]*/(?i:day|week|month|year|hour|min|h|d)|\d{1,3}"  # 250L$, +10/day, 0
    rb"|\d+[kKmM]"  # a size: 8k, 32k
)
# An identifier right before `(` is a call: llList2String(...), llMD5String(...).
_IDENTIFIER = re.compile(rb"[A-Za-z_$][A-Za-z0-9_.$]*")
# A name describing tokens rather than holding one: tokenizer, token_limit, max_tokens.
_COUNTING_NAME = re.compile(
    rb"(?i)tokeni[sz]|tokens?_?(?:limit|count|budget|usage|type|per)|max_?tokens"
)
_VETOABLE = frozenset(("secret-assignment", "url-token-param"))


def _honest_value(norm: bytes, m_start: int, v_start: int, v_end: int) -> bool:
    """True when a generic rule's value is honest text (pinned by tests)."""
    value = norm[v_start:v_end]
    if _HONEST_VALUE.fullmatch(value):
        return True
    if norm[v_end : v_end + 1] == b"(" and _IDENTIFIER.fullmatch(value):
        return True
    return _COUNTING_NAME.search(norm, m_start, v_start) is not None


class _Plan:
    """Compiled matchers for one set of active rules."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.rule_ids = tuple(rule.id for rule in rules)
        self.markers = tuple(_marker(rule) for rule in rules)
        self.spans = _alternation(rules, capture=False)  # where the matches are
        self.groups = _alternation(rules, capture=True)  # which rule, where its secret is
        names = {
            (k.decode() if isinstance(k, bytes) else k): v
            for k, v in self.groups.NamedCapturingGroups()
        }
        # per rule, in order: (group of its whole match, groups of its secret parts)
        self.rule_groups = tuple(
            (names[f"r{i}"], tuple(v for k, v in sorted(names.items()) if k.startswith(f"v{i}_")))
            for i in range(len(rules))
        )
        self.singles = tuple(_alternation((rule,), capture=False) for rule in rules)
        # Which rule matched: an RE2 set anchored at the match's start (its DFA is
        # cheap); then only that rule's own pattern is run with capture groups. The
        # groups of the whole alternation cost ~30 us a match once many rules wake.
        self.which = re2.Set.MatchSet(_options())
        for rule in rules:
            self.which.Add(_SECRET_GROUP.sub("(?:", rule.pattern))
        self.which.Compile()
        self.single_groups = tuple(_single_groups(rule) for rule in rules)
        self.vetoable = tuple(rule.id in _VETOABLE for rule in rules)

    def finditer(self, data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
        """(rule position, match start, match end, secret start, secret end) per match.

        Matches come in order of their start; they may overlap (SHORT_SECRET,
        CROSS_WINDOW).
        """
        done, size = 0, len(data)
        pending: tuple[int, int, int, int, int] | None = None
        while done < size:
            if pending is None:
                start, end = self.spans.Match(_UNANCHORED, data, done, size)[0]
                if start < 0:
                    return
                rule, secret_start, secret_end = self._locate(data, start, end)
            else:
                rule, start, end, secret_start, secret_end = pending
                pending = None
            yield rule, start, end, secret_start, secret_end
            if start < secret_start and secret_end - secret_start <= SHORT_SECRET:
                done = secret_start
                continue
            done = max(end, done + 1)
            # a match starting inside this secret and running past it (treated as the
            # next match, so a short secret in it is rescanned too)
            pending = self._crossing(data, secret_start, secret_end)

    def _crossing(self, data: bytes, start: int, end: int) -> tuple[int, int, int, int, int] | None:
        """A match that starts in the last CROSS_WINDOW bytes of the secret data[start:end]
        and runs past it, if any: a header value that ends where a PEM block begins, a
        YAML block whose last line starts a session-id reply. Bounded work per secret."""
        pos = max(start + 1, end - CROSS_WINDOW)
        limit = min(len(data), end + CROSS_WINDOW)
        for _ in range(16):  # a few nested matches ending with the secret (PEM dashes)
            if pos >= end:
                return None
            m_start, m_end = self.spans.Match(_UNANCHORED, data, pos, limit)[0]
            if m_start < 0 or m_start >= end:
                return None
            if m_end > end:  # past the secret (perhaps cut by the window): read it in full
                full_end = self.spans.Match(_ANCHOR_START, data, m_start, len(data))[0][1]
                if full_end > end:
                    rule, s_start, s_end = self._locate(data, m_start, full_end)
                    return rule, m_start, full_end, s_start, s_end
            pos = m_start + 1 if m_end >= end else max(m_end, m_start + 1)
        return None

    def _locate_by_rule(self, data: bytes, start: int, end: int) -> tuple[int, int, int] | None:
        """`_locate` through the set of rules and one rule's groups, or None."""
        hits = self.which.Match(data[start:end])
        if not hits:
            return None
        i = min(hits)
        single, secrets = self.single_groups[i]
        found: Spans = single.Match(_ANCHOR_START, data, start, end)
        if found[0] != (start, end):
            return None
        for group in secrets:
            if found[group][0] >= 0:
                return i, *found[group]
        return i, start, end

    def _locate(self, data: bytes, start: int, end: int) -> tuple[int, int, int]:
        """(rule position, secret start, secret end) of the match data[start:end]."""
        if end - start <= SMALL_MATCH:
            located = self._locate_by_rule(data, start, end)
            if located is not None:
                return located
            # the slice alone read differently (a word boundary at its end): all rules
            spans: Spans = self.groups.Match(_ANCHOR_START, data, start, end)
            if spans[0] == (start, end):
                for i, (whole, secrets) in enumerate(self.rule_groups):
                    if spans[whole][0] >= 0:
                        for group in secrets:
                            if spans[group][0] >= 0:
                                return i, *spans[group]
                        return i, start, end
        # A long span is replaced whole; the first rule matching here is the alternation's choice.
        for i, single in enumerate(self.singles):
            if single.Match(_ANCHOR_START, data, start, len(data))[0][0] >= 0:
                return i, start, end
        return 0, start, end  # unreachable: some rule matched here


def _keyword_set(keywords: tuple[str, ...], extra: tuple[str, ...] = ()) -> Any:
    """The keywords (case-insensitive), then `extra` entries, as one RE2 set."""
    found = re2.Set.SearchSet(_options())
    for keyword in keywords:
        found.Add("(?i)" + re2.escape(keyword))
    for entry in extra:
        found.Add(entry)
    found.Compile()
    return found


@functools.lru_cache(maxsize=64)
def _first_scan(keywords: tuple[str, ...]) -> Any:
    """Keywords and changed characters in one set, for the first scan of non-ASCII
    text (built on first use: ASCII-only processes never pay for it)."""
    return _keyword_set(keywords, _CHANGE_ENTRIES + _LOOKALIKE_ENTRIES)


# Every letter-bearing keyword of the built-in table, spelled with look-alikes.
_SPOOF_ENTRIES = _spoof_entries(sorted({kw for rule in RULES for kw in rule.keywords}))
_SPOOF_SET = _keyword_set((), _SPOOF_ENTRIES)
# One entry for all look-alike letters, last in the first scan: only a text holding one
# pays the look-alike scan (emoji, CJK and Arabic chat never do).
_LOOKALIKE_ENTRIES = ("[" + "".join(_CONFUSABLES) + "]",)


class Redactor:
    """Applies a rule table to text. Stateless after construction; safe to share.

    Every step is a linear scan. An RE2 set of every rule's keywords tells, in one
    pass over the normalized view, which rules can possibly match; ordinary chat
    usually wakes none and stops there. Then one alternation of just those rules,
    without capture groups, finds the matches with RE2's DFAs; each short match is
    re-read with groups to name its rule and find its secret part.
    """

    def __init__(self, rules: tuple[Rule, ...] = RULES) -> None:
        ids = [rule.id for rule in rules]
        if len(set(ids)) != len(ids):
            raise ValueError("rule ids must be unique")
        self.rules = rules
        keywords = sorted({kw for rule in rules for kw in rule.keywords})
        self._keywords = tuple(keywords)
        self._keyword_set = _keyword_set(self._keywords)
        # keyword index -> the rules it wakes; rules without keywords always run
        self._woken_by = [
            frozenset(i for i, rule in enumerate(rules) if kw in rule.keywords) for kw in keywords
        ]
        self._always = frozenset(i for i, rule in enumerate(rules) if not rule.keywords)
        # Every rule has keywords: then an ASCII text without escapes whose one scan
        # finds no keyword wakes no rule, and redact() returns it as is without the
        # rest of the path (its view is the text itself, and with no rule active
        # _spans finds nothing): the same answer, about 2 us sooner, twice a record.
        self._fast = not self._always
        # one compile per set of woken rules; real traffic wakes a few hundred sets
        self._plan = functools.lru_cache(maxsize=1024)(self._build_plan)

    def _build_plan(self, active: tuple[int, ...]) -> _Plan:
        return _Plan(tuple(self.rules[i] for i in active))

    def candidates(self, text: str | bytes) -> tuple[int, ...]:
        """Indexes of the rules whose keywords occur in `text` (the pre-filter).

        `text` is the normalized view (keywords are ASCII)."""
        return self._woken(self._keyword_set.Match(text) or ())

    def _view(self, text: str) -> tuple[_View | _DecodedView, tuple[int, ...]]:
        """(the normalized view of `text`, the rules its keywords wake).

        One RE2 set scan over the original finds both the keywords and the changed
        characters; only a text with changes is scanned again, as its view."""
        return self._views(text)[-1]

    def _char_view(self, text: str, data: bytes = b"") -> tuple[_View, tuple[int, ...]]:
        """`_view` of a text without escapes: invisible characters, compatibility forms,
        Unicode spaces and (next to a secret word spelled with them) look-alikes."""
        data = data or text.encode("utf-8")
        if text.isascii():
            return _View(data), self.candidates(data)
        hits = _first_scan(self._keywords).Match(data) or ()
        count, changes = len(self._keywords), len(_SEQUENCES)
        present = [_SEQUENCES[h - count] for h in hits if count <= h < count + changes]
        view = _View(data, tuple(sorted(present)), text) if present else None
        # a secret word spelled with look-alikes, once invisible characters are gone (a
        # set of its own: in the first scan's set it would crowd that set's DFA)
        spoofed = any(h >= count + changes for h in hits) and bool(
            _SPOOF_SET.Match(data if view is None else view.norm)
        )
        if spoofed:
            present += [c.encode("utf-8") for c in _CONFUSABLES if c in text]
            view = _View(data, tuple(sorted(present)), text)
        if view is None:
            return _View(data), self._woken(h for h in hits if h < count)
        return view, self.candidates(view.norm)

    def _woken(self, hits: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted(self._always.union(*(self._woken_by[h] for h in hits))))

    def _spans(self, text: str) -> tuple[_Plan | None, bytes, list[tuple[int, int, int]]]:
        """(plan, original bytes, [(rule, start, end)]) of the secrets to replace, in
        original byte offsets, merged where they overlap; a rule of -1 is the dense tail."""
        views = self._views(text)
        active = tuple(sorted({i for _, woken in views for i in woken}))
        if not active:
            return None, b"", []
        plan = self._plan(active)
        if len(views) == 1:
            return plan, views[0][0].data, self._spans_in(plan, views[0][0])
        # escapes decoded and not: a decoded `%7d` or `\u0022` may end a value early
        # that the text as written holds whole, so both readings count
        found = sorted(self._spans_in(plan, views[0][0]) + self._spans_in(plan, views[1][0]),
                       key=lambda span: (span[1], -span[2]))  # fmt: skip
        out: list[tuple[int, int, int]] = []
        for rule, start, end in found:
            if out and start < out[-1][2]:
                if end > out[-1][2]:
                    out[-1] = (out[-1][0], out[-1][1], end)
                continue
            out.append((rule, start, end))
        return plan, views[0][0].data, out

    def _views(self, text: str) -> list[tuple[_View | _DecodedView, tuple[int, ...]]]:
        """The view of `text` and, when it holds escapes, the view of what they stand for."""
        data = text.encode("utf-8")
        plain = self._char_view(text, data)
        if _may_escape(text) and _ESCAPE_PRESENT.search(data):
            decoded = _Decoded.of(data)
            if decoded is not None:
                inner, active = self._char_view(decoded.decoded.decode("utf-8"))
                return [plain, (_DecodedView(decoded, inner), active)]
        return [plain]

    def _spans_in(self, plan: _Plan, view: _View | _DecodedView) -> list[tuple[int, int, int]]:
        norm, data, mapped = view.norm, view.data, view.mapped
        budget = MATCH_BUDGET_BASE + len(data) // MATCH_BUDGET_BYTES
        out: list[tuple[int, int, int]] = []
        done = 0
        for rule, m_start, _, v_start, v_end in plan.finditer(norm):
            if plan.vetoable[rule] and _honest_value(norm, m_start, v_start, v_end):
                continue
            if mapped:
                view.build_map()
                s_start, s_end = view.start(v_start), view.end(v_end)
            else:
                s_start, s_end = v_start, v_end
            if s_start < done:
                # overlaps the secret just replaced: that one marker now covers both
                # (one marker, so redacting the output again changes nothing)
                if s_end > done:
                    last_rule, last_start, _ = out[-1]
                    out[-1] = (last_rule, last_start, s_end)
                    done = s_end
                continue
            if data.startswith(b"[REDACTED:", s_start) and _MARKER.fullmatch(data, s_start, s_end):
                continue  # already a marker: nothing to do, and the output stays a fixed point
            if len(out) >= budget:
                out.append((rule, s_start, len(data)))  # the dense tail, as one marker
                break
            out.append((rule, s_start, s_end))
            done = s_end
        return out

    def redact(self, text: str) -> tuple[str, int]:
        """(text with every secret replaced, number of replacements).

        The result is a fixed point of redaction. A replacement can complete a
        match around it (`SecureSessionID: <uuid>ghp_...`: the UUID ends at a word
        boundary only once the token glued to it is a marker), so a text that had
        matches is redacted again, up to SETTLE_ROUNDS times, until nothing changes.
        """
        if (
            self._fast
            and text.isascii()
            and not _may_escape(text)
            and not self._keyword_set.Match(text.encode("ascii"))
        ):
            return text, 0  # what _redact_full finds: nothing (see _fast)
        return self._redact_full(text)

    def _redact_full(self, text: str) -> tuple[str, int]:
        """redact() without its shortcut for text that wakes no rule."""
        out, count = self._redact_once(text)
        for _ in range(SETTLE_ROUNDS if count else 0):
            again, more = self._redact_once(out)
            if not more:
                break
            out, count = again, count + more
        return out, count

    def _redact_once(self, text: str) -> tuple[str, int]:
        plan, data, spans = self._spans(text)
        if not spans or plan is None:
            return text, 0
        pieces: list[bytes] = []
        done = 0
        for rule, start, end in spans:
            # what precedes the secret (a parameter name, a URL's host) stays readable
            pieces += (data[done:start], plan.markers[rule])
            done = end
        pieces.append(data[done:])
        return b"".join(pieces).decode("utf-8"), len(spans)

    def redact_named(self, name: str, value: str) -> tuple[str, int]:
        """Redact `value` as the value of a field called `name`.

        A tool named `password`, `DB_PASSWORD` or `get_secret_access_key` whose
        summary is the bare value: the value is read as `<name>: <value>` would be,
        so a secret-looking value goes (and a plain sentence stays). Text redaction
        alone must still change nothing in the result (it is a fixed point).
        """
        leaf = re.split(r"[:/]", normalize(name))[-1]  # `fetch:SessionToken`, `vault/password`
        if _SECRET_NAME.fullmatch(leaf) is None:
            return self.redact(value)
        # a JSON summary under a secret name: its "value" fields are the secret
        found = 0

        def hide(match: re.Match[str]) -> str:
            nonlocal found
            if not match[3] or _MARKER.fullmatch(match[3].encode("utf-8")):
                return match[0]
            found += 1
            return f"{match[1]}{match[2]}[REDACTED:secret-assignment]"

        value = _VALUE_FIELD.sub(hide, value)
        # a name the table always reads as secret (`name` may not be); an
        # Authorization value keeps its scheme word out of the value shape
        prefix = "Authorization: " if _AUTH_NAME.fullmatch(leaf) else "password: "
        out, count = self.redact(prefix + value)
        count += found
        if out.startswith(prefix):
            return out[len(prefix) :], count
        return "[REDACTED:secret-assignment]", max(count, 1)

    def secrets(self, text: str) -> list[tuple[str, str]]:
        """(rule id, secret) for every match: what redact() would remove.

        For tests and rule authoring only: the result is the secrets themselves.
        """
        plan, data, spans = self._spans(text)
        if plan is None:
            return []
        return [(plan.rule_ids[rule], data[s:e].decode("utf-8")) for rule, s, e in spans]


# A whole field name that says its value is a secret (as `redact_named` reads it):
# secret names, session ids (`SecureSessionID`, `session_id`), `Authorization`, `auth`.
_SESSION_NAME = r"(?i:(?:secure[ _\-]?)?session[ _\-]?id)"
_AUTH_NAME = re2.compile(r"(?i:(?:proxy-)?authorization)", _options())
_SECRET_NAME = re2.compile(
    f"(?:{ANY_NAME}|{LOOSE_NAME}|{SHORT_NAME}|{_SESSION_NAME}|(?i:(?:proxy-)?authorization))",
    _options(),
)
# `"value": "..."` in a summary under a secret name (JSON or a Python dict repr).
_VALUE_FIELD = re.compile(r"""(["']value["'][ \t]*:[ \t]*)(["'])((?:\\.|(?!\2)[^\\\n])*)""")

DEFAULT_REDACTOR = Redactor()


def redact(text: str) -> tuple[str, int]:
    """Redact with the built-in rule table."""
    return DEFAULT_REDACTOR.redact(text)
