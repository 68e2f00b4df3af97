# ruff: noqa: RUF001  (Cyrillic and Greek look-alikes are the point of these cases)
"""Round 4 of attacking redaction: cases that reached Redis unredacted before, each
pinned, checked in the raw bytes the server holds (fakeredis), not only in what
record() returns; honest look-alikes that must be stored byte for byte; escape-dense
text that must stay linear.

Found (all stored in clear before this round): camelCase short names (`dbPass`);
JSON/JS escapes in a name (`\\u0070assword`, `pass\\u0077ord`, double-escaped
`\\\\u0070`); percent-encoding (`%70assword=`, `p%61ssword=` in a query, `token%3D`
inside an encoded redirect, `api%5Fkey`); Cyrillic/Greek look-alike letters in a
secret word (`p\\u0430ssword`, `t\\u03bfken`, `\\u0430pi_key`); an HTML attribute
pair (`<input type="password" value="...">`).
"""

from __future__ import annotations

import fakeredis
import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from gridmem import AvatarMessage
from gridmem import ConversationStore
from gridmem import ManualClock
from gridmem.redaction import redact
from tests.conftest import examples
from tests.helpers import avatar
from tests.test_redaction_rules import _best_times

SECRET = "q8Zxw2rT9vB4nM1k"  # the value every case hides

# (what a person pastes, with SECRET somewhere in it)
LEAKED_BEFORE = [
    # camelCase short secret names
    f"dbPass={SECRET}",
    f'dbPass: "{SECRET}"',
    f"adminPw={SECRET}",
    f"redisAuth: {SECRET}",
    # JSON / JS escapes inside the name, single and double escaped
    f'{{"\\u0070assword": "{SECRET}"}}',
    f'{{"pass\\u0077ord": "{SECRET}"}}',
    f'{{\\"\\\\u0070assword\\": \\"{SECRET}\\"}}',
    f"\\x70assword={SECRET}",
    f'{{"t\\u006fken":"{SECRET}"}}',
    # percent-encoding
    f"%70assword={SECRET}",
    f"https://h.example.org/x?p%61ssword={SECRET}",
    f"https://h.example.org/x?redirect=https%3A%2F%2Fa.org%2F%3Ftoken%3D{SECRET}",
    f"https://h.example.org/x?q=token%3D{SECRET}",
    f"https://h.example.org/x?next=%2Fcb%3Faccess_token%3D{SECRET}%26x%3D1",
    f"password%3D{SECRET}",
    f"password%3d{SECRET}",
    f"https://h.example.org/x?%74oken={SECRET}",
    f"https://h.example.org/x?api%5Fkey={SECRET}",
    f"https://h.example.org/x?next=%253Ftoken%253D{SECRET}",
    # HTML character references
    f"&quot;password&quot;: &quot;{SECRET}&quot;",
    f"&#112;assword={SECRET}",
    f"&#x70;assword={SECRET}",
    # look-alike letters
    f"p\u0430ssword={SECRET}",
    f"passw\u043erd={SECRET}",
    f"p\u0430ssw\u043erd: {SECRET}",
    f"\u0440assword={SECRET}",
    f"t\u03bfken={SECRET}",
    f"\u0455ecret={SECRET}",
    f"\u0430pi_key={SECRET}",
    f"\u0430\u0440\u0456_\u043a\u0435\u0443={SECRET}",  # every letter Cyrillic
    f"p\u200b\u0430ssword={SECRET}",  # a look-alike behind an invisible character
    f"\u0455k-proj-{SECRET}abcd",
    f'{{"p\\u0430ssword": "{SECRET}"}}',  # an escaped look-alike
    # HTML / XML attributes
    f'<input type="password" value="{SECRET}">',
    f'<input type="password" name="pw" value="{SECRET}">',
    f"<input value='{SECRET}' type='password'>",
    f'<setting value="{SECRET}" name="ApiKey"/>',
]

# Caught before this round too; pinned so that decoding never loses them.
CAUGHT_BEFORE = [
    f"x_api_key={SECRET}",
    f"myPassword: {SECRET}",
    f"AWS_SECRET_ACCESS_KEY={SECRET}",
    f'{{\\"password\\": \\"{SECRET}\\"}}',
    f'{{\\\\\\"password\\\\\\": \\\\\\"{SECRET}\\\\\\"}}',
    f"pass\u200bword={SECRET}",
    f"pass\u00adword={SECRET}",
    f"pass\u202eword={SECRET}",
    "password=q8Zx\u200dw2rT9vB4nM1k",
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44\uff1d" + SECRET,
    f'<entry key="password">{SECRET}</entry>',
    f"db:\n  password: {SECRET}\n",
    f"password: >-\n  {SECRET}\n",
    f"?a=1&token={SECRET}",
    f"https://bob:{SECRET}@example.org/",
    f"Authorization: Bearer {SECRET}",
    # a value holding an escape: decoding `%7d` to `}` must not end it early
    "clientSecret=9yFfXn3%7g%7dRIdjWV3" + SECRET,
    f'"password": "ab\\u0022cd{SECRET}"',
    f'<input type="password" value="ab&quot;{SECRET}">',
]

HONEST = [
    "my password manager is great",
    "the key to success",
    "the key to success is patience: 10 years",
    "https://example.org/search?q=sandbox%20party&page=2",
    "see https://example.org/a%2Fb?x=%3D1",
    "100% sure, 50%off today, tax 5% and 3%2",
    "C:\\Users\\bob\\passwords.txt is a file name",
    'print("\\u00e9t\\u00e9")',
    'json.dumps({"user": "bob", "msg": "caf\\u00e9"})',
    "Tom &amp; Jerry &lt;3, AT&T and R&D, &quot;hello&quot; she said",
    "def check(password): return len(password) > 8",
    "if (token == null) { return; }",
    "const apiKey = process.env.API_KEY;",
    "пароль не скажу, ключ у меня",
    "Ключ к успеху: терпение",
    "ТОКЕН игры: золото",
    "Το κλειδί της επιτυχίας",
    "I used OAuth: v2 for the login",
    "the byPass road and the compass",
    '<input type="password" name="pw">',
    '<input type="text" value="hello world 2024">',
    '<label for="password">Password</label>',
    "\\x41\\x42 are escapes, %70 is a percent",
    '<a href="?page=2&amp;sort=asc">next</a>',
    "passwords are like toothbrushes",
    "the secret of the tea is the water",
    "keyboard shortcut: ctrl+k",
    "url https://hop.example.org/x?key_id=7",
    "\\\\server\\share\\tokens",
]


def _raw(client: fakeredis.FakeRedis) -> bytes:
    """Every key and value as the server holds them, as bytes."""
    out: list[bytes] = []
    for key in client.keys("*"):
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key))
        elif kind == b"hash":
            out += [x for kv in client.hgetall(key).items() for x in kv]
        elif kind == b"zset":
            out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"stream":
            out += [x for _, fields in client.xrange(key) for kv in fields.items() for x in kv]
    return b"\n".join(out)


def _stored_raw(text: str) -> bytes:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    ConversationStore(client, clock=ManualClock()).record(avatar(1), "im", AvatarMessage(text=text))
    return _raw(client)


def _survives(secret: str, raw: bytes, window: int = 8) -> bool:
    s = secret.encode()
    return any(s[i : i + window] in raw for i in range(len(s) - window + 1))


@pytest.mark.parametrize("text", LEAKED_BEFORE + CAUGHT_BEFORE)
def test_no_run_of_the_secret_reaches_redis(text: str) -> None:
    raw = _stored_raw(text)
    assert not _survives(SECRET, raw), raw
    assert redact(redact(text)[0])[0] == redact(text)[0]  # a fixed point


@pytest.mark.parametrize("text", HONEST)
def test_honest_look_alikes_are_stored_as_sent(text: str) -> None:
    assert redact(text) == (text, 0)
    store = ConversationStore(
        fakeredis.FakeRedis(server=fakeredis.FakeServer()), clock=ManualClock()
    )
    receipt = store.record(avatar(1), "im", AvatarMessage(text=text))
    assert receipt.redactions == 0
    assert [turn.text for turn in store.read_page(avatar(1), "im").turns] == [text]


LOOKALIKE = {"a": "\u0430", "o": "\u043e", "p": "\u0440", "e": "\u0435", "s": "\u0455"}
ESCAPES = st.sampled_from(["json", "percent", "html", "lookalike", "plain"])


def _disguise(name: str, how: str, picks: list[bool]) -> str:
    out = []
    for c, pick in zip(name, picks + [False] * len(name), strict=False):
        if not pick:
            out.append(c)
        elif how == "json":
            out.append(f"\\u{ord(c):04x}")
        elif how == "percent":
            out.append(f"%{ord(c):02X}")
        elif how == "html":
            out.append(f"&#{ord(c)};")
        elif how == "lookalike":
            out.append(LOOKALIKE.get(c, c))
        else:
            out.append(c)
    return "".join(out)


@settings(max_examples=examples(60))
@given(
    name=st.sampled_from(["password", "api_key", "secret", "token", "dbPassword", "passwd"]),
    how=ESCAPES,
    picks=st.lists(st.booleans(), max_size=10),
    sep=st.sampled_from(["=", ": ", '": "', "%3D"]),
)
@example(name="password", how="percent", picks=[True], sep="=")
@example(name="token", how="lookalike", picks=[False, True], sep="=")
def test_a_disguised_secret_name_still_names_a_secret(
    name: str, how: str, picks: list[bool], sep: str
) -> None:
    """Any letters of a secret name escaped or swapped for look-alikes: the value goes."""
    quote = '"' if sep == '": "' else ""
    text = f"{quote}{_disguise(name, how, picks)}{sep}{SECRET}{quote}"
    assert not _survives(SECRET, redact(text)[0].encode()), text


# -- linear time for escape-dense text (a ratio of times measured in the same rounds) ----

KiB = 1 << 10


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def _best(*texts: str, rounds: int = 3) -> list[float]:
    return _best_times(*texts, rounds=rounds)


@pytest.mark.parametrize(
    "unit", ["%41x", "\\u0070", "&quot;", "%70assword=ab%3D1 ", "p\u0430ssword=x1 ", "\\\\\\\\u"]
)
def test_escape_dense_text_scales_linearly(unit: str) -> None:
    """4x the input costs at most 8x the time (a quadratic step costs 16x): retried
    up to 3 times, since load slows one attempt and a quadratic step every one."""
    small, large = _repeat(unit, 64 * KiB), _repeat(unit, 256 * KiB)
    seen = []
    for _ in range(3):
        t_small, t_large = _best(small, large)
        seen.append((t_small, t_large))
        if t_large <= 8 * max(t_small, 0.0005):
            return
    pytest.fail(f"{unit!r}: (small, large) per attempt {seen}")
