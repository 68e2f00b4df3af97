"""The redaction engine: its rule table, the normalized view, false positives, speed.

Expected values (the secret that must vanish, the text that must stay) are
written here, never asked of the rules. tests/test_redaction.py and
tests/secret_corpus.py generate fresh instances of each family; this file pins
one hand-written positive per family, the value-shape decisions the rule table
documents, and the engine's own mechanisms (view, map, budget, fixed point).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gridmem.redaction import DEFAULT_REDACTOR
from gridmem.redaction import GRID_NEGATIVES
from gridmem.redaction import MATCH_BUDGET_BASE
from gridmem.redaction import RULES
from gridmem.redaction import Redactor
from gridmem.redaction import normalize
from gridmem.redaction import redact

pytestmark = pytest.mark.both_doors  # every store test, through both doors

SECRET = "q8ZxW2rT9vB4nM1kLp0a"  # 20 random characters: no rule's own word
UUID = "3f265554-a648-433a-ae08-c3efa0a71353"
HEX = UUID.replace("-", "")

ZW = "\u200b"  # zero-width space
ZWJ = "\u200d"
NBSP = "\u00a0"


def full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def gone(secret: str, out: str) -> bool:
    """No 8-character run of the secret is left, seen plainly or through the view."""
    seen = (out, normalize(out))
    return not any(secret[i : i + 8] in s for s in seen for i in range(len(secret) - 7))


# -- one positive per family (the brief's list); the second item is what must vanish --

FAMILIES: dict[str, tuple[str, str]] = {
    "prefixed env name": (f"DB_PASSWORD={SECRET}", SECRET),
    "long prefixed name": (f"MYSQL_ROOT_PASSWORD={SECRET}", SECRET),
    "export": (f"export GITHUB_TOKEN={SECRET}", SECRET),
    "snake with spaces": (f"aws_session_token = {SECRET}", SECRET),
    "camelCase": (f"dbPassword={SECRET}", SECRET),
    "camelCase colon": (f"clientSecret: {SECRET}", SECRET),
    "digit suffix": (f"password1={SECRET}", SECRET),
    "os.environ item": (f"os.environ['DB_PASSWORD'] = '{SECRET}'", SECRET),
    "dict literal": (f"{{'api_key': '{SECRET}'}}", SECRET),
    "JSON PascalCase": (f'{{"SecretAccessKey": "{SECRET}"}}', SECRET),
    "JSON SessionToken": (f'{{"SessionToken": "{SECRET}"}}', SECRET),
    "API Key phrase": (f"API Key: {SECRET}", SECRET),
    "api key is": (f"my api key is {SECRET}", SECRET),
    "backticks": (f"password: `{SECRET}`", SECRET),
    "CLI long flag": (f"mysql --password {SECRET} -h db", SECRET),
    "CLI glued -p": (f"mysql -uroot -p{SECRET} db", SECRET),
    "XML element": (f"<password>{SECRET}</password>", SECRET),
    "YAML": (f"db:\n  password: {SECRET}\n", SECRET),
    "YAML block scalar": (f"password: |\n  {SECRET}\n  {SECRET[::-1]}\n", SECRET[::-1]),
    "triple quotes": (f'password = """{SECRET} and more"""', SECRET),
    "next line": (f"password:\n{SECRET}", SECRET),
    "escaped quote inside": (f'"password": "ab\\"{SECRET}"', SECRET),
    "escaped JSON": (f'{{\\"password\\": \\"{SECRET}\\"}}', SECRET),
    "double-escaped JSON": (f'{{\\\\\\"password\\\\\\": \\\\\\"{SECRET}\\\\\\"}}', SECRET),
    "url empty user": (f"redis://:{SECRET}@cache.internal:6379/0", SECRET),
    "url no scheme": (f"//bob:{SECRET}@files.example.org/", SECRET),
    "url raw @ in password": (f"https://u:p@{SECRET}@host.example.org/", SECRET),
    "SecureSessionID colon": (f"SecureSessionID: {UUID}", UUID),
    "SecureSessionId equals": (f"SecureSessionId={UUID}", UUID),
    "perl arrow": (f"secure_session_id => {UUID}", UUID),
    "braces": (f"secure_session_id: {{{UUID}}}", UUID),
    "newline separator": (f"secure_session_id\n{UUID}", UUID),
    "XML-RPC": (
        f"<member><name>secure_session_id</name>\n<value><string>{UUID}</string></value></member>",
        UUID,
    ),
    "LLSD XML": (f"<key>secure_session_id</key>\n  <uuid>{UUID}</uuid>", UUID),
    "LLSD notation": (f"{{'secure_session_id':u{UUID}}}", UUID),
    "32-hex session": (f"session_id={HEX}", HEX),
    "Azure AccountKey": (f"AccountName=x;AccountKey={SECRET}==;EndpointSuffix=core", SECRET),
    "Azure SharedAccessKey": (f"SharedAccessKeyName=Root;SharedAccessKey={SECRET}=", SECRET),
    "Azure SAS sig": (f"https://a.blob.core.windows.net/c?sv=2022&sig={SECRET}%3D", SECRET),
    "LSL header list": (f'[HTTP_CUSTOM_HEADER, "X-Api-Key", "{SECRET}"]', SECRET),
    "LSL string constant": (f'string OPENAI_KEY = "{SECRET}";', SECRET),
    "LSL bearer": (
        f'llHTTPRequest(u, [HTTP_CUSTOM_HEADER, "Authorization", "Bearer {SECRET}"], "")',
        SECRET,
    ),
    "ghp_": (f"ghp_{SECRET}{SECRET[:16]}", SECRET),
    "github_pat_": (f"github_pat_{SECRET}_{SECRET}", SECRET),
    "sk-ant-": (f"sk-ant-api03-{SECRET}{SECRET}", SECRET),
    "sk-proj-": (f"sk-proj-{SECRET}{SECRET}", SECRET),
    "xapp-": (f"xapp-1-A0{SECRET}-123-{SECRET}", SECRET),
    "AKIA": ("AKIAQ8ZXW2RT9VB4NM1K", "AKIAQ8ZXW2RT9VB4NM1K"),
    "AIza": (f"AIza{SECRET}{SECRET[:15]}", SECRET),
    "glrt-": (f"glrt-{SECRET}", SECRET),
    "whsec_": (f"whsec_{SECRET}", SECRET),
    "GOCSPX-": (f"GOCSPX-{SECRET}", SECRET),
    "ya29.": (f"ya29.{SECRET}{SECRET}", SECRET),
    "1//0 refresh": (f"1//0g{SECRET}{SECRET}", SECRET),
    "unsigned JWT": (f"eyJhbGciOiJub25lIn0.eyJ{SECRET}.", SECRET),
    "npm_": (f"npm_{SECRET}{SECRET[:16]}", SECRET),
    "pypi-": (f"pypi-AgEIcHlwaS5vcmc{SECRET}{SECRET}", SECRET),
    "sk_live_": (f"sk_live_{SECRET}", SECRET),
    "SendGrid": (f"SG.{SECRET}.{SECRET}{SECRET}", SECRET),
    "Twilio": ("SK0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
    "Slack webhook": (f"https://hooks.slack.com/services/T0/B0/{SECRET}", SECRET),
    "Discord webhook": (f"https://discord.com/api/webhooks/1234567890/{SECRET}", SECRET),
    "Discord bot": (f"MTE2NzA4OTk4NzY1NDMyMTAxMg.GxYz12.{SECRET}{SECRET[:10]}", SECRET),
    "SSH2 PEM": (
        f"---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: x\n{SECRET}\n"
        "---- END SSH2 ENCRYPTED PRIVATE KEY ----",
        SECRET,
    ),
    "lowercase odd-spaced PEM": (
        f"-----begin  rsa   private key-----\n{SECRET}\n-----end rsa private key-----",
        SECRET,
    ),
    "PuTTY": (
        f"PuTTY-User-Key-File-3: ssh-ed25519\nPrivate-Lines: 1\n{SECRET}\nPrivate-MAC: 9f3a",
        SECRET,
    ),
    "PGP": (f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{SECRET}\n-----END PGP", SECRET),
    "cookie pair list": (f"Cookie: a=1; sid={SECRET}; csrftoken=x{SECRET[::-1]}", SECRET[::-1]),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_positive_is_redacted(name: str) -> None:
    text, secret = FAMILIES[name]
    out, count = redact(f"look: {text} ok")
    assert count >= 1 and gone(secret, out), out
    assert redact(out)[0] == out  # a fixed point


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_positive_glued_and_at_the_edges(name: str) -> None:
    """At the very start and end of the text, in a code fence, next to punctuation."""
    text, secret = FAMILIES[name]
    for wrapped in (text, f"({text})", f"```\n{text}\n```", f"*{text}*", f"{text}."):
        out = redact(wrapped)[0]
        assert gone(secret, out), (wrapped, out)


def test_every_family_next_to_every_other() -> None:
    """Pairwise, on one line and on two: each secret goes, whichever rule wins."""
    leaks = []
    items = list(FAMILIES.values())
    for first, s1 in items:
        for second, s2 in items:
            for sep in (" ", "\n"):
                out = redact(first + sep + second)[0]
                leaks += [(first, second) for s in (s1, s2) if not gone(s, out)]
    assert leaks == []


def test_many_secrets_in_one_text() -> None:
    text = " and ".join(t for t, _ in FAMILIES.values())
    out, count = redact(text)
    assert count >= len(FAMILIES) // 2
    assert [n for n, (_, s) in FAMILIES.items() if not gone(s, out)] == []


def test_header_value_then_pem_on_one_line() -> None:
    """Regression (main at 9f58390): the header's value ran to the end of the line and
    hid the PEM block from its rule, so the key body was stored."""
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + SECRET
    for header in (
        "X-Api-Key: KEY12345678",
        "Cookie: a=1",
        "Authorization: Bearer abcdefgh12345678",
    ):
        text = f"curl -H '{header}' -----BEGIN PRIVATE KEY-----{body}-----END PRIVATE KEY-----"
        out = redact(text)[0]
        assert gone(body, out) and "KEY12345678" not in out, out
        unquoted = f"curl -H {header} -----BEGIN PRIVATE KEY-----\n{body}\n"
        assert gone(body, redact(unquoted)[0])


# -- the normalized view and its map ------------------------------------------------------

INVISIBLE = [
    "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u180e", "\u2061", "\u2064",
    "\ufff9", "\ufffb", "\U00013430", "\U000e0041", "\u202a", "\u202e", "\u2066", "\u2069",
]  # fmt: skip


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_invisible_character_inside_a_token_goes_with_it(char: str) -> None:
    token = f"ghp_{SECRET}{SECRET[:16]}"
    for at in (3, 4, 10, len(token) - 1):
        text = f"my token {token[:at]}{char}{token[at:]} thanks"
        out, count = redact(text)
        assert count == 1 and out == "my token [REDACTED:github-token] thanks", out


def test_invisible_characters_everywhere_in_an_anthropic_key() -> None:
    """Regression: an sk-ant- key with invisible characters was half redacted."""
    key = f"sk-ant-api03-{SECRET}{SECRET}"
    text = "key: " + ZW.join(key) + " ok"
    out = redact(text)[0]
    assert out == "key: [REDACTED:anthropic-key] ok"


def test_full_width_token_is_redacted_whole() -> None:
    token = f"ghp_{SECRET}{SECRET[:16]}"
    out = redact(f"トークン {full_width(token)} です")[0]
    assert out == "トークン [REDACTED:github-token] です"


def test_unicode_spaces_separate_like_spaces() -> None:
    for space in (NBSP, "\u2003", "\u202f", "\u3000"):
        out = redact(f"curl{space}-u{space}admin:{SECRET}{space}https://h")[0]
        assert gone(SECRET, out) and out.endswith(f"{space}https://h"), out
        out = redact(f"my{space}password{space}is{space}{SECRET}!")[0]
        assert gone(SECRET, out)


def test_text_around_a_secret_is_kept_byte_for_byte() -> None:
    """The map: only the secret's span of the original goes; invisible characters and
    full-width text outside it stay as sent."""
    before = f"{full_width('hello')}{ZW}{NBSP}👨{ZWJ}👩{ZWJ}👧 see "
    after = f"{ZW} «{NBSP}ok{NBSP}» {full_width('end')}"
    out = redact(before + "ghp_" + ZW.join(SECRET + SECRET[:16]) + after)[0]
    assert out == before + "[REDACTED:github-token]" + after


def test_emoji_and_non_latin_text_skip_the_view() -> None:
    for text in (
        "👨\u200d👩\u200d👧 and 🏳\ufe0f\u200d🌈",
        "砂場はどこですか\uff1fパスワードは教えません。",
    ):
        assert normalize(text) == text
        assert redact(text) == (text, 0)
    # a full-width question mark next to an ideographic space: both folded in the view
    cjk = "砂場はどこですか\uff1f\u3000パスワードは教えません。"
    assert normalize(cjk) != cjk and redact(cjk) == (cjk, 0)
    french = "Il a dit\u00a0: «\u00a0bonjour\u00a0»"  # NBSP next to ASCII: a space in the view
    assert normalize(french) == "Il a dit : « bonjour »"
    assert redact(french) == (french, 0)


def test_the_view_folds_and_drops() -> None:
    assert normalize(full_width("abc123")) == "abc123"
    assert normalize(f"ab{ZW}cd") == "abcd"
    assert normalize(f"x{ZW}{ZWJ}\u00ady") == "xy"


# -- false positives an attacker or a resident would notice --------------------------------

CHAT_NEGATIVES = (
    "Secret: Santa",
    "season pass: 2024",
    "cookie: chocolate chip",
    "my password is too weak lol",
    "the token of appreciation",
    "password is required",
    "the password is ok",
    "key owner_key = llGetOwner();",
    "key target_key = NULL_KEY;",
    "integer pass = TRUE;",
    'llSetText("Pass: " + (string)n, <1,1,1>, 1.0); llSay(0, "rest of the line");',
    'string token_name = "Gold Coin";',
    "sort_key = lambda x: x[1]",
    "password = getpass()",
    'password = os.environ["DB_PASSWORD"]',
    'token = request.headers.get("X-Token")',
    "gcc -pthread -pedantic x.c && ssh -p 2222 host",
    "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
    "agent_id=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
    "http://maps.secondlife.com/secondlife/Ahern/128/128/25",
    "hop://grid.example.org:8002/Sandbox/128/128/25",
    "asset 3a7bd3e2360a3d29eea436fcfb7e44c735d117c4",
    "[REDACTED:openai-key] [REDACTED:x] [REDACTED:secret-assignment]",
    "password=[REDACTED:secret-assignment]",
    "X-Api-Key: [REDACTED:credential-header]",
    "Привет, мир! مرحبا بالعالم 你好\uff0c世界",
)


@pytest.mark.parametrize("text", (*GRID_NEGATIVES, *CHAT_NEGATIVES))
def test_everyday_text_is_unchanged(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_examples(rule: object) -> None:
    """Each rule alone redacts its positives with its own marker; the full table leaves
    its negatives alone; each positive holds one of the rule's keywords."""
    alone = Redactor((rule,))  # type: ignore[arg-type]
    for example in rule.positives:  # type: ignore[attr-defined]
        out, count = alone.redact(example)
        assert count >= 1 and f"[REDACTED:{rule.id}]" in out, example  # type: ignore[attr-defined]
        assert any(k in normalize(example).lower() for k in rule.keywords)  # type: ignore[attr-defined]
    for example in rule.negatives:  # type: ignore[attr-defined]
        assert redact(example) == (example, 0), example


# -- fixed point ---------------------------------------------------------------------------


def _all_texts() -> list[str]:
    texts = [t for t, _ in FAMILIES.values()] + list(GRID_NEGATIVES) + list(CHAT_NEGATIVES)
    texts += [p for rule in RULES for p in rule.positives]
    texts += [t for t, _ in FAMILIES.values()]
    return texts


def test_redaction_is_a_fixed_point_everywhere() -> None:
    texts = _all_texts()
    pairs = [a + sep + b for a in texts[:60] for b in texts[-60:] for sep in (" ", "\n", "")]
    for text in texts + pairs + [h(4096) for h in HOSTILE.values()]:
        out = redact(text)[0]
        assert redact(out)[0] == out, text


# -- the match budget ------------------------------------------------------------------------


def test_match_dense_text_ends_in_one_marker_and_leaks_nothing() -> None:
    unit = f"?token={SECRET}&"
    text = unit * (MATCH_BUDGET_BASE + 200)
    out, count = redact(text)
    assert SECRET not in out
    assert count <= MATCH_BUDGET_BASE + 1 + len(text) // 1024
    assert out.endswith("[REDACTED:url-token-param]")
    assert redact(out)[0] == out


def test_honest_text_with_a_few_dozen_secrets_is_redacted_one_by_one() -> None:
    text = "\n".join(f"VAR_{i}_TOKEN={SECRET}{i}" for i in range(40))
    out, count = redact(text)
    assert count == 40 and out.count("=[REDACTED:secret-assignment]") == 40


# -- linear time ---------------------------------------------------------------------------------

KiB = 1 << 10


def _repeat(unit: str) -> Callable[[int], str]:
    return lambda n: (unit * (n // len(unit) + 1))[:n]


HOSTILE: dict[str, Callable[[int], str]] = {
    "token: ": _repeat("token: "),
    "?token=a&": _repeat("?token=a&"),
    "://a:b@": _repeat("://a:b@"),
    "password=": _repeat("password="),
    '"password":"': _repeat('"password":"'),
    '\\"': _repeat('\\"'),
    "PEM header": _repeat("-----BEGIN PRIVATE KEY-----"),
    "invisible": _repeat(f"ab{ZW}c{ZWJ}d\u00ad "),
    "mixed script": _repeat(
        "Привет 砂場\uff1f\u3000\uff48\uff45\uff4c\uff4c\uff4f مرحبا «\u00a0x\u00a0» 👨\u200d👩 "
    ),
    "short secrets": _repeat("token=Bearer auth_token: -----BEGIN secret=Cookie: pwd=x "),
    "long secrets": _repeat(f'Cookie: a={SECRET} "password": "{SECRET}" '),
}
BENIGN = _repeat(
    "hi! is the sandbox open? 👨\u200d👩\u200d👧 see "
    "http://maps.secondlife.com/secondlife/Ahern/128/128/25 ok\n"
)


def _best_times(*texts: str, rounds: int = 5) -> list[float]:
    """Best-of-`rounds` time of each text, measured interleaved in the same rounds, so
    a shared machine's burst slows every text alike instead of one of them."""
    best = [float("inf")] * len(texts)
    for _ in range(rounds):
        for k, text in enumerate(texts):
            start = time.perf_counter()
            DEFAULT_REDACTOR.redact(text)
            best[k] = min(best[k], time.perf_counter() - start)
    return best


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_text_is_linear_and_near_benign(name: str) -> None:
    """Time grows with length, not its square, and stays near benign text.

    The documented figure is 5x benign (bench/redaction.py measures it at 1 MiB);
    the bound here is 15x, a 3x margin for a shared CI machine, which still catches
    any per-match rescan or quadratic step (those cost 100x and more at this size).
    Ratios come from times measured in the same interleaved rounds; a failing
    measurement is taken again (up to 3 attempts): load makes one attempt slow, a
    quadratic step makes every attempt slow.
    """
    make = HOSTILE[name]
    texts = (BENIGN(512 * KiB), make(128 * KiB), make(512 * KiB))
    seen = []
    for _ in range(3):
        benign, small, large = _best_times(*texts)
        seen.append((large, benign, small))
        if large <= 15 * max(benign, 0.001) and large <= 12 * max(small, 0.0005):
            return  # 4x the input may cost at most 12x
    pytest.fail(f"hostile {name!r} (large, benign, small) per attempt: {seen}")


# -- names: any suffix after a secret word, and tools named like a secret ------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"export password_prod={SECRET}%", SECRET),
        (f"config:\n  ADMIN_PASSWORD_old: {SECRET}+x\n  port: 5432", SECRET),
        (f"{{'PrivateKey_old': '{SECRET}', 'user': 'bob'}}", SECRET),
        (f"smtpAuthToken_old={SECRET}.x", SECRET),
        (f"token_old =\n{SECRET}", SECRET),
        (f'os.environ["client-secret_old"]="{SECRET}"', SECRET),
    ],
)
def test_a_secret_word_with_any_suffix_names_a_machine_made_value(text: str, secret: str) -> None:
    assert gone(secret, redact(text)[0])


@pytest.mark.parametrize(
    "text", ['string token_name = "Gold Coin";', "max_tokens = 4096", 'password_hint = "first pet"']
)
def test_a_suffixed_name_keeps_a_plain_value(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize(
    "tool",
    [
        "password",
        "DB_PASSWORD",
        "clientSecret",
        "get_secret_access_key",
        "SessionToken",
        "fetch:SessionToken",
        "vault.read_password",
    ],
)
def test_a_tool_named_like_a_secret_loses_its_bare_value(
    tool: str, store: object, redis: object
) -> None:
    """A tool summary that is the bare value of a secret-named tool: nothing of it in
    Redis (fakeredis and the real servers), and plain words under such a tool stay."""
    from gridmem import ConversationStore
    from gridmem import ToolSummary
    from tests.doors import BlockingDoor
    from tests.helpers import avatar
    from tests.helpers import dump_all

    assert isinstance(store, ConversationStore | BlockingDoor)  # either door
    who = avatar(7)
    receipt = store.record(who, "im", ToolSummary(tool=tool, summary=SECRET))
    assert receipt.redactions == 1 and SECRET not in dump_all(redis)
    store.record(who, "im", ToolSummary(tool=tool, summary="not found"))
    texts = [t.text for t in store.read_page(who, "im").turns]
    assert texts == ["[REDACTED:secret-assignment]", "not found"]
    assert DEFAULT_REDACTOR.redact_named("web.fetch", SECRET) == (SECRET, 0)


@pytest.mark.parametrize("indent", ["\u202f\u3000", "\u00a0\u2009", "\u3000\u2003\u3000"])
def test_unicode_space_indentation_before_an_llsd_uuid(indent: str) -> None:
    """Regression (rx-tests 06:47): a newline then Unicode-space indentation before
    `<uuid>` kept a session id once spaces were folded only next to visible ASCII."""
    text = f"<key>secure_session_id</key>\n{indent}<uuid>{UUID}</uuid>"
    assert gone(UUID, redact(text)[0])


@pytest.mark.parametrize(
    "text",
    [
        f"API\u200a\u205fKey: {SECRET}",
        f"authorization: Basic\u1680\u2060\u2003{SECRET}",
        f"session_id\u202f\u034f\u2002{UUID}",
        f"-----\u3000\u200b\u2002BEGIN RSA PRIVATE KEY-----\n{SECRET}",
    ],
)
def test_invisible_characters_between_unicode_spaces(text: str) -> None:
    """Regression (rx-tests): a format character between two Unicode spaces stayed in
    the view and broke the separator."""
    secret = UUID if UUID in text else SECRET
    assert gone(secret, redact(text)[0])


# -- round 3: invisible characters that are not Cf, look-alike punctuation -------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("token ghp_aB3dE5fG\ufe0f7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4", "7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"),
        ("SecureSessionID: 8a5e2c1b-0\ufe00d6f-4f3a-9c1e-7b2d4e6f8a90", "4f3a-9c1e-7b2d4e6f8a90"),
        ("DB_PASS\U000e0100WORD=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("password\ufe0f=\ufe0fXq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("token ghp_aB3dE5fG\u31647hJ9kL1mN2pQ4rS6tU8vW0xY2zA4", "7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"),
        ("token ghp_aB3dE5fG\uffa07hJ9kL1mN2pQ4rS6tU8vW0xY2zA4", "7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"),
        ("pass\u115fword=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("pass\u17b4word=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("pass\u17b5word=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("pass\u0300word=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("sk\u2011proj\u2011aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4", "aB3dE5fG7hJ9kL1mN2pQ4rS6"),
        ("glpat\u2013abcdefghij0123456789XY", "abcdefghij0123456789XY"),
        ("password\u2236Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        (
            "eyJhbGciOiJIUzI1NiJ9\u3002eyJzdWIiOiIxMjM0NTY3ODkwIn0\u3002dozjgNryP4J3jVmNHl0w5N_X",
            "dozjgNryP4J3jVmNHl0w5N_X",
        ),
        (
            "\u2014\u2014\u2014\u2014\u2014BEGIN PRIVATE KEY\u2014\u2014\u2014\u2014\u2014\nMIIEvQIBADANBgkqhkiG9w0B\n",
            "MIIEvQIBADANBgkqhkiG9w0B",
        ),
        (
            "\uff30\uff21\uff33\uff33\uff37\uff2f\uff32\uff24\u3000\uff1d\u3000Xq7mP2vLr9tKw4nZ",
            "Xq7mP2vLr9tKw4nZ",
        ),
    ],
)
def test_round3_invisible_and_lookalike_characters(text: str, secret: str) -> None:
    out = redact(text)[0]
    assert secret not in normalize(out) and secret not in out
    assert redact(out)[0] == out


@pytest.mark.parametrize(
    "text",
    [
        "👍\ufe0f great, see you at 5\u2013 6 pm",  # emoji selector, en dash in prose
        "👨\u200d👩\u200d👧 and 🏳\ufe0f\u200d🌈 — both welcome",
        "caf\u0065\u0301 au lait \u2014 password reset is on Friday",
    ],
)
def test_round3_honest_text_with_selectors_and_dashes_stays(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize(
    "text",
    [
        "string token = llList2String(tokens, 0);",
        "tokens = llList2List(tokens, 1, -1);",
        "string password = llList2String(parts, 1);",
        "string pwd = llMD5String(input, 0);",
        "string secret = llBase64ToString(data);",
        "for (i = 0; i < llGetListLength(tokens); ++i) { string token = llList2String(tokens, i); }",
        "tokens: 250L$",
        "5 tokens: 100L$",
        "tokens: +10/day",
        "tokenizer: bpe-32k",
        "token_limit: 8k",
        "secret: top-secret",
        "password: required",
        "password: ********",
        "password=$DB_PASSWORD",
        "password=${DB_PASSWORD}",
        "Authorization: pending",
        "Authorization: pending review",
        "https://shop.example.org/?code=promo2024",
        "https://h/?session=2&token=0",
        "season pass: 2024",
        "bypass: abc123x",
        "AUTH required for this command",
    ],
)
def test_round3_honest_values_stay_byte_for_byte(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        # real-looking values next to the false-positive shapes still go
        ("password: 12345678", "12345678"),
        ("password=$3cr3t!Val9", "3cr3t!Val9"),
        ("Token: Gold-Coin-01", "Gold-Coin-01"),
        (
            "https://app.example.org/cb?code=4/0AX4XfWh8q8Zxw2rT9vB4nM1k",
            "0AX4XfWh8q8Zxw2rT9vB4nM1k",
        ),
        # short secret names
        ("auth=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ('{"user": "bob", "pass": "Xq7mP2vLr9tKw4nZ"}', "Xq7mP2vLr9tKw4nZ"),
        ("pw=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("passwd: Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("REDIS_AUTH=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("ADMIN_PASS: Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("session_key=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ('consumer_key = "Xq7mP2vLr9tKw4nZ"', "Xq7mP2vLr9tKw4nZ"),
        ("requirepass Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("AUTH Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("redis-cli -h cache -a Xq7mP2vLr9tKw4nZ ping", "Xq7mP2vLr9tKw4nZ"),
        ("user=bob&pass=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("https://h/x?pass=Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("my pw: CorrectHorse9Battery", "CorrectHorse9Battery"),
        ("'X-Api-Key' => 'Xq7mP2vLr9tKw4nZ',", "Xq7mP2vLr9tKw4nZ"),
        ('password := "Xq7mP2vLr9tKw4nZ"', "Xq7mP2vLr9tKw4nZ"),
        ("machine api.example.org login bob password Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        # Authorization: any scheme word
        ("Authorization: Bot Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ('{"Authorization": "Bot Xq7mP2vLr9tKw4nZ"}', "Xq7mP2vLr9tKw4nZ"),
        ("Authorization: SharedKey acct:Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("Authorization: JWT Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("Authorization: Key Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        (
            'Authorization: OAuth oauth_consumer_key="ck", oauth_signature="Xq7mP2vLr9tKw4nZ"',
            "Xq7mP2vLr9tKw4nZ",
        ),
        (
            "Authorization: AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=Xq7mP2vLr9tKw4nZ",
            "Xq7mP2vLr9tKw4nZ",
        ),
        ("'Authorization' => 'Basic Ym9iOmh1bnRlcjIyMjI='", "Ym9iOmh1bnRlcjIyMjI"),
        ('authorization := "Basic Ym9iOmh1bnRlcjIyMjI="', "Ym9iOmh1bnRlcjIyMjI"),
    ],
)
def test_round3_secrets_go(text: str, secret: str) -> None:
    out = redact(text)[0]
    assert secret not in out and secret not in normalize(out)
    assert redact(out)[0] == out


@pytest.mark.parametrize(
    ("tool", "summary", "stays"),
    [
        ("SecureSessionID", "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "not set"),
        ("session_id", "8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90", "not set"),
        ("Authorization", "Bot Xq7mP2vLr9tKw4nZ", "pending"),
        ("auth", "Xq7mP2vLr9tKw4nZ", "not found"),
        ("DB_PASSWORD", '{"value": "Xq7mP2vLr9tKw4nZ"}', '{"value": ""}'),
        ("password", "{'value': 'hunter'}", "not found"),
    ],
)
def test_round3_secret_tool_and_action_names(
    tool: str, summary: str, stays: str, store: object, redis: object
) -> None:
    """Tool summaries and action details under a secret name: nothing of the value in
    Redis (fakeredis and real servers); honest words stay."""
    from gridmem import ActionResult
    from gridmem import ConversationStore
    from gridmem import ToolSummary
    from tests.doors import BlockingDoor
    from tests.helpers import avatar
    from tests.helpers import dump_all

    assert isinstance(store, ConversationStore | BlockingDoor)  # either door
    who = avatar(8)
    secret = (
        summary.split('"')[-2]
        if '"' in summary
        else summary.split("'")[-2]
        if "'" in summary
        else summary
    )
    secret = secret.split()[-1]
    store.record(who, "im", ToolSummary(tool=tool, summary=summary))
    store.record(who, "im", ActionResult(action=tool, status="ok", detail=summary))
    assert secret not in dump_all(redis)
    assert DEFAULT_REDACTOR.redact_named(tool, stays) == (stays, 0)
    out = DEFAULT_REDACTOR.redact_named(tool, summary)[0]
    assert redact(out)[0] == out


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("AKIAIOSFODNN7EXAMPL3 / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ", "bPxRfiCYEXAMPLEKEZ"),
        ("AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "bPxRfiCYEXAMPLEKEY"),
        (
            "AWS Secret Access Key [None]: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "bPxRfiCYEXAMPLEKEY",
        ),
        (
            "User name,Password,Access key ID,Secret access key\n"
            "bob,x,AKIAIOSFODNN7EXAMPLE,wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "bPxRfiCYEXAMPLEKEY",
        ),
        (
            "Access key ID\tSecret access key\nAKIAIOSFODNN7EXAMPLE\twJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "bPxRfiCYEXAMPLEKEY",
        ),
        (
            "CREDENTIALS\tASIAY34FZKBOKMUTVV7A\t2030-01-01T00:00:00Z\twJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "bPxRfiCYEXAMPLEKEY",
        ),
        ('{"text": "password:\\n  Xq7mP2vLr9tKw4nZ"}', "Xq7mP2vLr9tKw4nZ"),
        ('{"log": "DB_PASSWORD=\\nXq7mP2vLr9tKw4nZ"}', "Xq7mP2vLr9tKw4nZ"),
        ('{"out": "password:\\tXq7mP2vLr9tKw4nZ"}', "Xq7mP2vLr9tKw4nZ"),
        ('{"xml": "<password>Xq7mP2vLr9tKw4nZ<\\/password>"}', "Xq7mP2vLr9tKw4nZ"),
        ("postgres:\\/\\/u:Xq7mP2vLr9tKw4nZ@h\\/db", "Xq7mP2vLr9tKw4nZ"),
        ("<password_prod>TlVqVxm!1*NSGLbb%vtpUsBpy4</password_prod>", "TlVqVxm!1*NSGLbb"),
    ],
)
def test_round3_aws_pairs_and_escaped_separators(text: str, secret: str) -> None:
    out = redact(text)[0]
    assert secret not in out and secret not in normalize(out)
    assert redact(out)[0] == out


@pytest.mark.parametrize(
    "text",
    [
        "<token_name>Gold Coin</token_name>",
        '{"text": "password:\\n  is reset every Friday"}',
        "AKIAIOSFODNN7EXAMPLE is the id, the key stays in the vault",
    ],
)
def test_round3_escaped_separator_negatives(text: str) -> None:
    out = redact(text)[0]
    assert "Gold Coin" in out or "Friday" in out or "the key stays in the vault" in out
    assert "[REDACTED:aws-key-pair]" not in out and redact(out)[0] == out


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('the password is "Xq7mP2vLr9tKw4nZ"', "Xq7mP2vLr9tKw4nZ"),
        ("the password is: `Xq7mP2vLr9tKw4nZ`", "Xq7mP2vLr9tKw4nZ"),
        ("password is:\nXq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ('{"msg": "the password is \\"Xq7mP2vLr9tKw4nZ\\""}', "Xq7mP2vLr9tKw4nZ"),
        ("**password:** Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("**password**: Xq7mP2vLr9tKw4nZ", "Xq7mP2vLr9tKw4nZ"),
        ("- **API key**: `Xq7mP2vLr9tKw4nZ`", "Xq7mP2vLr9tKw4nZ"),
    ],
)
def test_round3_phrases_and_markdown_names(text: str, secret: str) -> None:
    out = redact(text)[0]
    assert secret not in out and redact(out)[0] == out


@pytest.mark.parametrize(
    "text",
    ['the password is "ok"', "**Password:** required", "**Secret**: Santa", "**Token**: see below"],
)
def test_round3_phrases_and_markdown_negatives(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("docker login -u bob -p Xq7mP2vLr9tKw4nZ registry.example.org", "Xq7mP2vLr9tKw4nZ"),
        (
            "az login --service-principal -u http://app -p Xq7mP2vLr9tKw4nZ --tenant t",
            "Xq7mP2vLr9tKw4nZ",
        ),
        ("CREATE USER bob IDENTIFIED BY 'Xq7mP2vLr9tKw4nZ';", "Xq7mP2vLr9tKw4nZ"),
        (
            'ALTER USER x IDENTIFIED WITH mysql_native_password BY "Xq7mP2vLr9tKw4nZ"',
            "Xq7mP2vLr9tKw4nZ",
        ),
        ("CtL8Q~ZPf7s-tg7NvlE3Lar-uSrjLnonWKTn9UGK", "ZPf7s-tg7NvlE3Lar-uSrjLnon"),
        ("Value\tCtL8Q~ZPf7s-tg7NvlE3Lar-uSrjLnonWKTn9UGK", "ZPf7s-tg7NvlE3Lar-uSrjLnon"),
        ("tool login --token = uTC1JtzM1VIsQ8Hks3", "uTC1JtzM1VIsQ8Hks3"),
    ],
)
def test_round3_login_flags_sql_and_azure(text: str, secret: str) -> None:
    out = redact(text)[0]
    assert secret not in out and redact(out)[0] == out


@pytest.mark.parametrize(
    "text", ["after login: ssh -p 2222 host", "identified by her voice", "Q~ is a tilde after a Q"]
)
def test_round3_login_flags_negatives(text: str) -> None:
    assert redact(text) == (text, 0)


@pytest.mark.parametrize(
    "text",
    [
        "- name: DB_PASSWORD\n  value: Xq7mP2vLr9tKw4nZ",
        '{"name": "DB_PASSWORD", "value": "Xq7mP2vLr9tKw4nZ"}',
        '<add key="DB_PASSWORD" value="Xq7mP2vLr9tKw4nZ" />',
        '<property name="password" value="Xq7mP2vLr9tKw4nZ"/>',
        '<entry key="password">Xq7mP2vLr9tKw4nZ</entry>',
    ],
)
def test_round3_name_value_pairs(text: str) -> None:
    out = redact(text)[0]
    assert "Xq7mP2vLr9tKw4nZ" not in out and redact(out)[0] == out


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "DB_HOST", "value": "db.example.org"}',
        '<add key="token_name" value="Gold Coin" />',
        "- name: DB_PORT\n  value: 5432",
    ],
)
def test_round3_name_value_pairs_negatives(text: str) -> None:
    assert redact(text) == (text, 0)
