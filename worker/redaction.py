"""Secret and capability-URL redaction, before anything is sent to Redis.

Residents paste capability URLs, login hashes, API keys and passwords into chat,
and tools return URLs with tokens. Every text field passes through `redact()`
before it is encoded, so no secret is ever an argument of a Redis command.

The rules are a curated table: an id, an RE2 pattern, literal keywords that any
match must contain (a cheap pre-filter), and positive and negative examples that
the tests run. A pattern may mark the secret part with `(?P<secret>...)`; then
only that part is replaced and the rest (a parameter name, a URL's host) stays
readable. Each match becomes `[REDACTED:<rule-id>]`.

All patterns run as one alternation in google-re2, a linear-time engine: no
chat line, however crafted, can make matching backtrack. Rules earlier in the
table win where two could match at the same place (RE2 is leftmost-first), so
specific rules precede generic ones.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2

UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# An optional scheme://host[:port] in front of a path, so the whole URL goes.
URL_HEAD = r"(?:[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/?#]+)?"
# Characters that end a bare secret value in chat: whitespace, quotes, separators.
VALUE = r"[^\s\"'`,;<>()\[\]{}]"


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of secret. `keywords` are lowercase literals a match must contain."""

    id: str
    pattern: str
    keywords: tuple[str, ...]
    positives: tuple[str, ...]
    negatives: tuple[str, ...] = ()


# Everyday grid text that no rule may touch; every rule is tested against these too.
GRID_NEGATIVES: tuple[str, ...] = (
    "my key is 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90, add me",
    "texture 89556747-24cb-43ed-920b-47caed15465f on the prim",
    "hop://grid.example.org:8002/Sandbox%20One/128/128/25",
    "secondlife:///app/agent/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/about",
    "secondlife://Ahern/128/128/25",
    "http://maps.secondlife.com/secondlife/Ahern/128/128/25",
    'key owner = llGetOwner(); llRegionSayTo(owner, 0, "hello");',
    "llSetPos(<128, 128, 25>); vector v = <0.5, 0.5, 1.0>;",
    "asset hash 3a7bd3e2360a3d29eea436fcfb7e44c735d117c4",
    "the sandbox resets at noon, ask the skeleton crew at sk-8 park",
    "task-force meeting: keys, tokens and passwords are not for chat",
    "[REDACTED:openai-key] was already removed",
)

RULES: tuple[Rule, ...] = (
    # -- private key blocks first: they contain every other kind of text ---------
    Rule(
        "pem-private-key",
        r"-----BEGIN (?:RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----"
        r"(?:(?s:.)*?-----END (?:RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----|(?s:.)*)",
        ("private key-----",),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7x\n-----END RSA PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC (pasted, cut off)",
        ),
        (
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
        ),
    ),
    Rule(
        "openssh-private-key",
        r"-----BEGIN OPENSSH PRIVATE KEY-----"
        r"(?:(?s:.)*?-----END OPENSSH PRIVATE KEY-----|(?s:.)*)",
        ("openssh private key",),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        ),
        (
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@host",
        ),
    ),
    Rule(
        "pgp-private-key",
        r"-----BEGIN PGP PRIVATE KEY BLOCK-----"
        r"(?:(?s:.)*?-----END PGP PRIVATE KEY BLOCK-----|(?s:.)*)",
        ("pgp private key",),
        ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF2\n-----END PGP PRIVATE KEY BLOCK-----",),
        ("-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQENBF2\n-----END PGP PUBLIC KEY BLOCK-----",),
    ),
    Rule(
        "putty-private-key",
        r"PuTTY-User-Key-File-\d+:(?:(?s:.)*?Private-MAC:[ \t]*[0-9a-fA-F]+|(?s:.)*)",
        ("putty-user-key-file-",),
        (
            "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: me\nPublic-Lines: 2\n"
            "AAAAC3NzaC1lZDI1NTE5\nPrivate-Lines: 1\nAAAAIGx4\nPrivate-MAC: 8f2c0a1b3d4e5f60",
        ),
        ("I converted my key with PuTTYgen yesterday",),
    ),
    # -- grid capabilities and login secrets --------------------------------------
    Rule(
        "grid-eqg-cap",
        URL_HEAD + r"/(?i:caps)/(?i:eqg)/" + UUID + r"/?",
        ("/eqg/",),
        ("https://sim7.agni.lindenlab.com:12043/CAPS/EQG/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/",),
        ("the event queue (EQG) was slow today",),
    ),
    Rule(
        "grid-seed-cap",
        URL_HEAD + r"/(?i:caps)/" + UUID + r"(?:0000)?/?",
        ("/caps/",),
        (
            "http://sim.example.org:9000/CAPS/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a900000/",
            "/CAPS/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/",
            "seed cap: https://simhost-0a1b2c3d.agni.secondlife.io:12043/caps/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
        ),
        ("CAPS LOCK is on, sorry", "see /caps/ in the docs"),
    ),
    Rule(
        "grid-cap",
        URL_HEAD + r"/(?i:cap)/" + UUID + r"(?:/" + VALUE + r"*)?",
        ("/cap/",),
        (
            "https://sim1.agni.lindenlab.com:12043/cap/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "http://127.0.0.1:9000/cap/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/upload",
        ),
        ("nice cap/hat combo", "/cap/ is where the sim serves capabilities"),
    ),
    Rule(
        "grid-lslhttp",
        URL_HEAD + r"/(?i:lslhttps?)/" + UUID + r"/?" + VALUE + r"*",
        ("/lslhttp",),
        (
            "http://grid.example.org:9000/lslhttp/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/",
            "/lslhttps/8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90/?q=1",
        ),
        ("llRequestURL() gives you an lslhttp URL",),
    ),
    Rule(
        "grid-session-id",
        r"(?i:\b(?:secure_)?session_?id)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<secret>" + UUID + ")",
        ("session",),
        (
            "session_id=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "'secure_session_id': '8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90'",
            "SessionID: 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
        ),
        ("your session is 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90 minutes old?",),
    ),
    Rule(
        "grid-login-hash",
        r"\$1\$[0-9a-fA-F]{32}\b",
        ("$1$",),
        ("passwd=$1$5f4dcc3b5aa765d61d8327deb882cf99", "$1$5F4DCC3B5AA765D61D8327DEB882CF99"),
        ("it cost $1 $2 $3", "$1$abc"),
    ),
    # -- URLs carrying credentials ---------------------------------------------------
    Rule(
        "url-userinfo",
        r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://(?P<secret>[^\s/?#@:\"']+:[^\s/?#@\"']+)@",
        ("://",),
        (
            "https://bob:hunter2@example.org/x",
            "redis://default:s3cr3tP4ss@cache.internal:6379/0",
        ),
        ("mailto:someone@example.org", "https://example.org/@someone", "http://host:8080/path"),
    ),
    Rule(
        "slack-webhook",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/" + VALUE + r"+",
        ("hooks.slack.com",),
        ("https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",),
        ("post it in the slack channel",),
    ),
    Rule(
        "discord-webhook",
        r"https://(?:\w+\.)?discord(?:app)?\.com/api/webhooks/\d+/" + VALUE + r"+",
        ("/api/webhooks/",),
        (
            "https://discord.com/api/webhooks/123456789012345678/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        ("https://discord.gg/gridparty",),
    ),
    Rule(
        "url-token-param",
        r"[?&;](?i:access_token|refresh_token|id_token|auth_token|token|api_key|apikey|key|"
        r"client_secret|secret|password|passwd|pwd|sig|signature|x-amz-signature|"
        r"x-amz-credential|x-amz-security-token|auth|session|sessionid|session_id|code)"
        r"=(?P<secret>[^&\s#\"'<>]+)",
        ("=",),
        (
            "https://api.example.com/v1/items?token=abc123def456&page=2",
            "https://maps.googleapis.com/maps/api/js?key=AIzaSyD-not-a-real-key-000",
            "https://bucket.s3.amazonaws.com/f.png?X-Amz-Signature=3b1f00c0ffee&X-Amz-Expires=60",
            "http://sim.example.org:9000/?session=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
        ),
        ("https://example.org/search?q=sandbox&page=2", "https://example.org/?keyboard=us"),
    ),
    # -- HTTP credentials -------------------------------------------------------------
    Rule(
        "authorization-header",
        r"(?i:\b(?:proxy-)?authorization)[ \t]*:[ \t]*(?P<secret>(?:(?i:bearer|basic|token|digest|"
        r"negotiate)[ \t]+)?[^\s\"']+)",
        ("authorization",),
        (
            "Authorization: Basic Ym9iOmh1bnRlcjI=",
            'curl -H "Authorization: token 0123456789abcdef0123" https://api.example.org',
        ),
        ("authorization is needed for that parcel",),
    ),
    Rule(
        "bearer-token",
        r"(?i:\bbearer)[ \t]+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)",
        ("bearer",),
        ("use Bearer abcdefghijklmnop1234 for it", "bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        ("the bearer of this notecard", "ring bearer duties"),
    ),
    # The value runs to the end of the line, quotes included: one that stopped at a
    # quote left what follows it (`Cookie: a=b api_key = "..."`) for no rule to see.
    Rule(
        "credential-header",
        r"(?i:\b(?:x-api-key|api-key|x-auth-token|x-access-token|private-token|x-goog-api-key|"
        r"cookie|set-cookie))[ \t]*:[ \t]*(?P<secret>[^\r\n]+)",
        ("key:", "token:", "cookie:", "key :", "token :", "cookie :"),
        (
            "curl -H 'X-Api-Key: 8f14e45fceea167a5a36dedd4bea2543' https://api.example.org",
            "Cookie: sessionid=abc123; csrftoken=def456",
            "PRIVATE-TOKEN: glp-not-a-real-one-123",
        ),
        ("the cookie jar is on the table", "my api-key question: where do I get one?"),
    ),
    Rule(
        "curl-user",
        r"(?:\s|^)(?:-u|--user)[ \t=]+[\"']?(?P<secret>[^\s\"':]+:[^\s\"']+)",
        ("-u", "--user"),
        ("curl -u admin:changeme https://example.org", "curl --user=bob:pa55word http://h"),
        ("use -u to set the user", "sign-up: open"),
    ),
    # -- provider keys -------------------------------------------------------------------
    Rule(
        "anthropic-key",
        r"\bsk-ant-[A-Za-z0-9_\-]{20,}",
        ("sk-ant-",),
        ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789_ABCDEFG-hijk",),
        ("sk-ant-short",),
    ),
    Rule(
        "openai-key",
        r"\bsk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}",
        ("sk-",),
        (
            "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ",
            "OPENAI_API_KEY=sk-proj-abcdefghijklmnop_qrstuvwx-yz0123456789",
            "sk-svcacct-0123456789abcdefghijklmnopqrst",
        ),
        ("sk-8 park", "task-force-alpha-bravo-charlie-delta-echo"),
    ),
    Rule(
        "google-api-key",
        r"\bAIza[0-9A-Za-z_\-]{30,}",
        ("aiza",),
        ("AIzaSyA1234567890abcdefghijklmnopqrstuv",),
        ("AIzawesome idea",),
    ),
    Rule(
        "huggingface-token",
        r"\b(?:hf|api_org)_[A-Za-z0-9]{30,}",
        ("hf_", "api_org_"),
        ("hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "api_org_abcdefghijklmnopqrstuvwxyzABCD"),
        ("hf_ is the prefix of Hugging Face tokens",),
    ),
    Rule(
        "github-token",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
        ("ghp_0123456789abcdefghijklmnopqrstuvwxyz", "ghs_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"),
        ("ghp_short",),
    ),
    Rule(
        "github-pat",
        r"\bgithub_pat_[A-Za-z0-9_]{22,}",
        ("github_pat_",),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",),
        ("github_pat_ tokens are fine-grained",),
    ),
    Rule(
        "gitlab-token",
        r"\bglpat-[A-Za-z0-9_\-]{20,}",
        ("glpat-",),
        ("glpat-abcdefghij0123456789",),
        ("glpat- is GitLab's prefix",),
    ),
    Rule(
        "slack-token",
        r"\bxox[abposre]-[A-Za-z0-9\-]{10,}",
        ("xox",),
        ("xoxb-123456789012-123456789012-abcdefghijklmnopqrstuvwx", "xoxp-1234567890-abcdef"),
        ("xoxo, see you tomorrow",),
    ),
    Rule(
        "stripe-key",
        r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}",
        ("_live_", "_test_"),
        ("sk_live_0123456789abcdefABCDEF", "rk_test_abcdefghijklmnopqrstuvwx"),
        ("run_test_suite before you push",),
    ),
    Rule(
        "aws-access-key",
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
        ("akia", "asia", "abia", "acca"),
        ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id = ASIAY34FZKBOKMUTVV7A"),
        ("ASIA is a continent", "AKIAIOSFODNN7EXAMPLEX is too long"),
    ),
    Rule(
        "aws-secret-key",
        r"(?i:aws_?secret_?(?:access_?)?key)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<secret>[A-Za-z0-9/+=]{40})",
        ("secret",),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",),
        ("where is the aws secret key setting?",),
    ),
    Rule(
        "sendgrid-key",
        r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}\b",
        ("sg.",),
        ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",),
        ("SG.1 is the first region",),
    ),
    Rule(
        "npm-token",
        r"\bnpm_[A-Za-z0-9]{36}\b",
        ("npm_",),
        ("npm_abcdefghijklmnopqrstuvwxyz0123456789",),
        ("npm_config_cache is a setting",),
    ),
    Rule(
        "telegram-bot-token",
        r"\b\d{8,10}:AA[A-Za-z0-9_\-]{33}\b",
        (":aa",),
        ("123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0",),
        ("meet at 12:AA gate",),
    ),
    Rule(
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        ("eyj",),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ),
        ("eyJ is how base64 JSON starts",),
    ),
    # -- generic assignments and phrases, last: everything specific has had its turn ---
    Rule(
        "secret-assignment",
        r"(?i:\b(?:password|passwd|passphrase|pwd|secret|client_secret|api_?key|api-key|access_?key|"
        r"secret_?key|private_?key|access_token|auth_token|refresh_token|token))"
        # an HTTP auth scheme word is not the secret: what follows it is
        r"[\"']?[ \t]*(?::=|=>|[:=])[ \t]*[\"']?"
        r"(?P<secret>(?:(?i:bearer|basic|digest|token)[ \t]+)?" + VALUE + r"{4,})",
        ("pass", "pwd", "secret", "key", "token"),
        (
            "password=hunter2",
            "auth_token: Basic dXNlcjpwYXNzd29yZA==",
            "PASSWORD: correct-horse-battery",
            'api_key = "0123456789abcdef"',
            "{'token': 'tok_1234567890'}",
            'string pwd = "letmein!";',
        ),
        ("password is required", "the api key page", "token: ok", "key = llGetOwner"),
    ),
    Rule(
        "password-phrase",
        r"(?i:\b(?:my|the|our|your)[ \t]+(?:password|passwd|pw|passcode|pin)[ \t]+(?:is|was)[ \t]*:?)"
        r"[ \t]+(?P<secret>[^\s\"']{4,})",
        ("pass", " pw ", " pin "),
        ("my password is Tr0ub4dor&3", "the passcode was 8812-ab"),
        ("the password is ok", "my pin is 42"),
    ),
)


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


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = 64 << 20  # room for the DFA on hostile input: it stays on the fast path
    return options


# google-re2's Pythonic wrapper builds a generator and a Match object per call;
# the hot loops below call the underlying RE2 object, which returns spans directly.
_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED
_ANCHOR_START = re2._re2.RE2.Anchor.ANCHOR_START
Spans = list[tuple[int, int]]


def _compile(pattern: str) -> Any:
    """A raw RE2 over UTF-8 bytes (compiled and checked by the public API)."""
    return re2.compile(pattern.encode("utf-8"), _options())._regexp


def _alternation(rules: tuple[Rule, ...], *, capture: bool) -> Any:
    """All rules as one leftmost-first alternation.

    With `capture`, group r<i> is rule i and v<i> its secret part; without, the
    pattern has no groups at all, so RE2 finds spans with its DFAs alone.
    """
    parts = []
    for i, rule in enumerate(rules):
        if capture:
            pattern = rule.pattern.replace("(?P<secret>", f"(?P<v{i}>")
            parts.append(f"(?P<r{i}>{pattern})")
        else:
            parts.append("(?:" + rule.pattern.replace("(?P<secret>", "(?:") + ")")
    return _compile("|".join(parts))


def _marker(rule: Rule) -> bytes:
    return f"[REDACTED:{rule.id}]".encode("ascii")


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
        # per rule, in order: (group of its whole match, group of its secret or None)
        self.rule_groups = tuple((names[f"r{i}"], names.get(f"v{i}")) for i in range(len(rules)))
        self.singles = tuple(_alternation((rule,), capture=False) for rule in rules)

    def finditer(self, data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
        """(rule position, match start, match end, secret start, secret end) per match.

        Matches come in order of their start; they may overlap (SHORT_SECRET).
        """
        done, size = 0, len(data)
        while done < size:
            start, end = self.spans.Match(_UNANCHORED, data, done, size)[0]
            if start < 0:
                return
            rule, secret_start, secret_end = self._locate(data, start, end)
            yield rule, start, end, secret_start, secret_end
            rescan = start < secret_start and secret_end - secret_start <= SHORT_SECRET
            done = secret_start if rescan else end

    def _locate(self, data: bytes, start: int, end: int) -> tuple[int, int, int]:
        """(rule position, secret start, secret end) of the match data[start:end]."""
        if end - start <= SMALL_MATCH:
            spans: Spans = self.groups.Match(_ANCHOR_START, data, start, end)
            if spans[0] == (start, end):
                for i, (whole, secret) in enumerate(self.rule_groups):
                    if spans[whole][0] >= 0:
                        if secret is not None and spans[secret][0] >= 0:
                            return i, *spans[secret]
                        return i, start, end
        # A long span is replaced whole; the first rule matching here is the alternation's choice.
        for i, single in enumerate(self.singles):
            if single.Match(_ANCHOR_START, data, start, len(data))[0][0] >= 0:
                return i, start, end
        return 0, start, end  # unreachable: some rule matched here


class Redactor:
    """Applies a rule table to text. Stateless after construction; safe to share.

    Every step is a linear RE2 scan. An RE2 set of every rule's keywords tells,
    in one pass, which rules can possibly match; ordinary chat usually wakes
    none and stops there. Then one alternation of just those rules, without
    capture groups, finds the matches with RE2's DFAs; each short match is
    re-read with groups to name its rule and find its secret part. Matching runs
    on the UTF-8 bytes, so no character offsets are converted.
    """

    def __init__(self, rules: tuple[Rule, ...] = RULES) -> None:
        ids = [rule.id for rule in rules]
        if len(set(ids)) != len(ids):
            raise ValueError("rule ids must be unique")
        self.rules = rules
        keywords = sorted({kw for rule in rules for kw in rule.keywords})
        self._keyword_set = re2.Set.SearchSet(_options())
        for keyword in keywords:
            self._keyword_set.Add("(?i)" + re2.escape(keyword))
        self._keyword_set.Compile()
        # keyword index -> the rules it wakes; rules without keywords always run
        self._woken_by = [
            frozenset(i for i, rule in enumerate(rules) if kw in rule.keywords) for kw in keywords
        ]
        self._always = frozenset(i for i, rule in enumerate(rules) if not rule.keywords)
        self._plan = functools.lru_cache(maxsize=256)(self._build_plan)

    def _build_plan(self, active: tuple[int, ...]) -> _Plan:
        return _Plan(tuple(self.rules[i] for i in active))

    def candidates(self, text: str) -> tuple[int, ...]:
        """Indexes of the rules whose keywords occur in `text` (the pre-filter)."""
        hits = self._keyword_set.Match(text) or ()
        return tuple(sorted(self._always.union(*(self._woken_by[h] for h in hits))))

    def redact(self, text: str) -> tuple[str, int]:
        """(text with every secret replaced, number of replacements)."""
        active = self.candidates(text)
        if not active:
            return text, 0
        plan = self._plan(active)
        data = text.encode("utf-8")
        pieces: list[bytes] = []
        done = 0
        for rule, _, _, secret_start, secret_end in plan.finditer(data):
            if secret_start < done:
                # overlaps the secret just replaced: that one marker now covers both
                # (one marker, so redacting the output again changes nothing)
                done = max(done, secret_end)
                continue
            # what precedes the secret (a parameter name, a URL's host) stays readable
            pieces += (data[done:secret_start], plan.markers[rule])
            done = secret_end
        if not pieces:
            return text, 0
        pieces.append(data[done:])
        return b"".join(pieces).decode("utf-8"), len(pieces) // 2

    def secrets(self, text: str) -> list[tuple[str, str]]:
        """(rule id, secret) for every match: what redact() would remove.

        For tests and rule authoring only: the result is the secrets themselves.
        """
        active = self.candidates(text)
        if not active:
            return []
        plan = self._plan(active)
        data = text.encode("utf-8")
        return [
            (plan.rule_ids[rule], data[s_start:s_end].decode("utf-8"))
            for rule, _, _, s_start, s_end in plan.finditer(data)
        ]


DEFAULT_REDACTOR = Redactor()


def redact(text: str) -> tuple[str, int]:
    """Redact with the built-in rule table."""
    return DEFAULT_REDACTOR.redact(text)
