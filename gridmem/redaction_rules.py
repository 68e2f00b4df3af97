"""The redaction rule table: what a secret looks like, with examples the tests run.

Patterns are RE2 syntax and run over the *normalized view* of a text (see
gridmem/redaction.py): invisible format characters are gone, compatibility forms
(full-width letters) are folded to ASCII and Unicode spaces (NBSP, U+3000...)
are plain spaces.
So a pattern is written for plain ASCII and still catches a full-width `ghp_...` or a
token with a zero-width space inside.

A pattern may mark the secret part with `(?P<secret>...)`; only that part is
replaced, and the rest (a parameter name, a URL's host) stays readable. Rules
earlier in the table win where two could match at the same place (RE2 is
leftmost-first), so specific rules precede generic ones.

Value shapes (a family decision, pinned by tests/test_redaction_rules.py):
- after a secret-named key, a *quoted* value of any length is a secret
  (`"password": "x y"`), quotes escaped inside it or around it included;
- an *unquoted* value is a secret when it looks like one: 4+ characters with a
  digit or symbol (`hunter2`, `correct-horse`), or 8+ letters (`swordfish1` and
  `changeme` alike); a common word (`Secret: Santa`, `pass = TRUE`) stays;
- a word-like value (no digit or symbol) directly followed by `(` or `[` is
  code (`getpass()`, `os.environ["X"]`), not a secret, and so is any identifier
  directly followed by `(`, digits or not (`llList2String(tokens, 0)`: the
  check after the match in gridmem/redaction.py); a value with a digit or symbol
  glued to other punctuation is still a secret;
- `... is <value>` phrases (`my password is ...`, `api key is ...`) need a digit
  or symbol in the value, so `my password is too weak lol` stays.
A name describing a secret rather than holding one (`token_name`, `sort_key`,
`owner_key`) is not a secret name: `string token_name = "Gold Coin";` stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from gridmem.ids import UUID_ANY_CASE

UUID = UUID_ANY_CASE
HEX32 = r"[0-9a-fA-F]{32}"
# An optional scheme://host[:port] in front of a path, so the whole URL goes.
URL_HEAD = r"(?:[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s/?#]+)?"
# Characters that end a bare secret value in chat: whitespace, quotes, separators.
VALUE = r"[^\s\"'`,;<>()\[\]{}\\]"
# A character that makes a bare value look machine-made: a digit or a symbol.
# ('.', '_' and ':' are left out: `os.environ`, `NULL_KEY` are references.)
_MARK = r"[0-9#$%&*+\-/@^|~=]"
# A bare value that looks like a secret: 4+ characters with a mark, or 8+ letters.
# (RE2 has no lookahead: "length >= 4 and holds a mark" is spelled out by position.)
_V = VALUE
MARKED = (
    rf"(?:{_MARK}{_V}{{3,}}|{_V}{_MARK}{_V}{{2,}}|{_V}{{2}}{_MARK}{_V}+|{_V}{{3,}}{_MARK}{_V}*)"
)
WORDY = rf"[A-Za-z]{{8,}}{_V}*"
LOOKS_SECRET = rf"(?:{MARKED}|{WORDY})"
# Letters together with digits or symbols, in either order.
_LETTER = r"[A-Za-z]"
MIXED = rf"(?:{_V}*{_LETTER}{_V}*{_MARK}{_V}*|{_V}*{_MARK}{_V}*{_LETTER}{_V}*)"
# The rest of an element's opening tag, through its `>`; never a `/>`, which closes an
# empty element (`<add key="app_pwd" value="..."/>`): what follows one is not its text.
OPEN_TAG_REST = r"(?:[^/>\n]|/+[^/>\n])*>"
# In an `... is <value>` phrase: 6+ characters with a digit or an inner symbol.
_PHRASE_MARK = r"[0-9#$%&*+\-/@^|~=]"
PHRASE_VALUE = (
    rf"(?:{_PHRASE_MARK}{_V}{{5,}}|{_V}{_PHRASE_MARK}{_V}{{4,}}|{_V}{{2}}{_PHRASE_MARK}{_V}{{3,}}"
    rf"|{_V}{{3}}{_PHRASE_MARK}{_V}{{2,}}|{_V}{{4}}{_PHRASE_MARK}{_V}+|{_V}{{5,}}{_PHRASE_MARK}{_V}*)"
)
# What ends a bare value that is not code: anything but a call or an index.
NOT_CODE = r"(?:[^(\[\w.]|\z)"

# The word in a name that says the value is a secret (case-insensitive; camelCase,
# prefixes and suffixes around it are allowed by NAME).
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase|code)|pwd|secret|token|credentials?|"
    r"api[ _\-]{0,3}key|apikey|access[_\-]?key|secret[_\-]?key|private[_\-]?key|account[_\-]?key|"
    r"shared[_\-]?access[_\-]?key|master[_\-]?key|signing[_\-]?key|encryption[_\-]?key|"
    r"auth[_\-]?key|app[_\-]?key|client[_\-]?key|license[_\-]?key|subscription[_\-]?key|"
    r"sas[_\-]?key|webhook[_\-]?secret|session[_\-]?key|consumer[_\-]?key"
)
# A name around a secret word: prefix (`DB_`, `aws_session_`, `db`, `client`), the
# word, and only suffixes that keep it a secret (`1`, `_value`, `B64`):
# `token_name`, `password_hint` are names of things about a secret, not secrets.
_SUFFIX = r"(?:[_\-.]?(?:\d+|value|val|str|string|b64|base64|hex|raw|enc|encrypted|plain|text))*"
NAME = rf"[A-Za-z0-9_.\-]*(?i:{_SECRET_WORDS}){_SUFFIX}"
# A secret word with any suffix after it (`password_prod`, `smtpAuthToken_old`): for
# these the value itself must look machine-made (MIXED), since `token_name`,
# `password_hint` and `max_tokens` name things about a secret.
LOOSE_NAME = rf"[A-Za-z0-9_.\-]*(?i:{_SECRET_WORDS})[A-Za-z0-9_.\-]+"
# Short secret words (`auth`, `pass`, `pw`, `passwd`): a whole word or after a
# separator (`REDIS_AUTH`, `ADMIN_PASS`, `db.pw`), never inside a word (`bypass`,
# `compass`); their value must look machine-made like LOOSE_NAME's (`season pass: 2024`).
# camelCase counts as a separator (`dbPass`, `adminPw`, `redisAuth`, `dbPASS`): a
# capital after a small letter or digit; `OAuth` (a capital before it) is not one.
SHORT_NAME = (
    r"\b(?:(?:[A-Za-z0-9.\-]*[_.\-])?(?i:auth|pass|pw|passwd|rootpw|requirepass|masterauth)"
    r"|[A-Za-z0-9]*[a-z0-9](?:Pass|PASS|Passwd|Pw|PW|Auth|AUTH))"
    r"(?:[_\-.]?\d+)?\b"
)
# An upper-case environment name ending in _KEY: OPENAI_KEY, STRIPE_KEY.
ENV_KEY = r"(?-i:[A-Z][A-Z0-9_]*_KEY[0-9]*)"
ANY_NAME = rf"(?:{ENV_KEY}|{NAME})"
# Between a name and its value: the name's closing quote (escaped or not), an
# index's `]` after it (never a bare `]`: a marker's rule id may read like a name), `=`, `:`, `:=`, `=>`, optionally the next line.
NAME_END = r"(?:\\*[\"'`]\]?|\*\*|__)?"  # (markdown bold: `**password**: x`)
# (inside escaped JSON a log's `\n` and `\t` are two characters: `"password:\\n  x"`)
ASSIGN = r"[ \t]*(?::=|=>|[:=])(?:\*\*|__)?(?:[ \t]|\\t)*(?:(?:\r?\n|\\r\\n|\\n)(?:[ \t]|\\t)*)?"


# A quoted value: triple quotes, then one level of quotes per escaping depth.
# A value may hold its own escaped quotes (`"ab\"cd"`), and inside escaped JSON
# (`{\"password\": \"...\"}`) a quote escaped one level deeper.
def quoted(tag: str) -> str:
    """A quoted value; its secret groups are named `<tag>1`... (RE2 wants unique names)."""
    return (
        rf"(?:\"\"\"(?P<{tag}1>(?s:.)+?)\"\"\"|'''(?P<{tag}2>(?s:.)+?)'''"
        rf"|\\{{3}}\"(?P<{tag}3>(?:[^\"\\\n]|\\+[^\"\\\n]|\\{{4,}}\")+)\\{{3}}\""
        rf"|\\\"(?P<{tag}4>(?:[^\"\\\n]|\\+[^\"\\\n]|\\{{2,}}\")+)\\\""
        rf"|\"(?P<{tag}5>(?:[^\"\\\n]|\\.)+)\""
        rf"|'(?P<{tag}6>(?:[^'\\\n]|\\.)+)'"
        rf"|`(?P<{tag}7>[^`\n]+)`)"
    )


# A YAML block scalar: `password: |` and the indented lines under it.
YAML_BLOCK = r"[|>][+\-]?[ \t]*\r?\n(?P<secret_yaml>(?:[ \t]+[^\r\n]*(?:\r?\n|\z))+)"
# One cookie: name=value (the value may be quoted).
COOKIE_PAIR = r"[^\s=;,\"'\\]+=(?:\"[^\"\n]*\"|[^;\s\"'\\]*)"
# PEM-style armour, spacing and case as pasted: `-----BEGIN RSA PRIVATE KEY-----`,
# `---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----`, `-----begin private key-----`.
_ARMOUR_END = r"[ \t]*-{3,}"
_OPEN_TAIL = (
    r"(?:(?s:.)*?-{3,}[ \t]*(?i:end)[ \t]+(?:[A-Za-z0-9]+[ \t]+)*(?i:private)[ \t]+(?i:key)(?:[ \t]+(?i:block))?"
    + _ARMOUR_END
    + r"|(?s:.)*)"
)


# One credential after an Authorization scheme: `k="v"` (OAuth) or a token with a
# digit or symbol in it (`Authorization: pending review` is prose).
_AUTH_CRED = r"(?:[A-Za-z0-9_\-]+=\\*\"[^\"\\\n]*\\*\"|[^\s\"'\\,;]*[0-9+/=:~_\-.][^\s\"'\\,;]*|[^\s\"'\\,;]{16,})"


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
    # false positives an attacker (or a resident) would notice
    "key owner_key = llGetOwner();",
    "key target_key = NULL_KEY;",
    "integer pass = TRUE;",
    'llSetText("Pass: " + (string)n, <1,1,1>, 1.0);',
    'string token_name = "Gold Coin";',
    "sort_key = lambda x: x[1]",
    "password = getpass()",
    'password = os.environ["DB_PASSWORD"]',
    'token = request.headers.get("X-Token")',
    "Secret: Santa",
    "Secret: Santa, gifts by Friday!",
    "season pass: 2024",
    "cookie: chocolate chip",
    "my password is too weak lol",
    "the token of appreciation",
    "👨\u200d👩\u200d👧 family photo at the 🏳\ufe0f\u200d🌈 parade",
    "мой ключ 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90, пароль не скажу",
    "مرحبا، أين صندوق الرمل؟",
    "砂場はどこですか\uff1f\u3000パスワードは教えません。",
    "Il a dit\u00a0: «\u00a0bonjour\u00a0» et puis\u202f!",
    "see [REDACTED:secret-assignment] and [REDACTED:x] here",
)

RULES: tuple[Rule, ...] = (
    # -- private key blocks first: they contain every other kind of text ---------
    Rule(
        "openssh-private-key",
        r"-{3,}[ \t]*(?i:begin)[ \t]+(?i:openssh)[ \t]+(?i:private)[ \t]+(?i:key)"
        + _ARMOUR_END
        + _OPEN_TAIL,
        ("openssh",),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        ),
        (
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@host",
        ),
    ),
    Rule(
        "pgp-private-key",
        r"-{3,}[ \t]*(?i:begin)[ \t]+(?i:pgp)[ \t]+(?i:private)[ \t]+(?i:key)[ \t]+(?i:block)"
        + _ARMOUR_END
        + _OPEN_TAIL,
        ("pgp",),
        ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF2\n-----END PGP PRIVATE KEY BLOCK-----",),
        ("-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQENBF2\n-----END PGP PUBLIC KEY BLOCK-----",),
    ),
    Rule(
        "pem-private-key",
        r"-{3,}[ \t]*(?i:begin)[ \t]+(?:[A-Za-z0-9]+[ \t]+)*(?i:private)[ \t]+(?i:key)"
        + _ARMOUR_END
        + _OPEN_TAIL,
        ("private",),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7x\n-----END RSA PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC (pasted, cut off)",
            "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: x\nAAAAB3NzaC1yc2E\n---- END SSH2 ENCRYPTED PRIVATE KEY ----",
            "-----begin  ec  private key-----\nMHcCAQEEIBq\n-----end ec private key-----",
        ),
        (
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
        ),
    ),
    Rule(
        "putty-private-key",
        r"(?i:putty-user-key-file-)\d+:(?:(?s:.)*?(?i:private-mac):[ \t]*[0-9a-fA-F]+|(?s:.)*)",
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
    # Session secrets as viewers, login replies and LLSD show them: any spelling of
    # the name, then quotes, `:`/`=`/`=>`, spaces or newlines, XML-RPC and LLSD tags,
    # LLSD notation's `u` prefix, braces; the UUID dashed or as 32 hex digits.
    Rule(
        "grid-session-id",
        r"(?i:(?:secure[ _\-]?)?session[ _\-]?id)"
        r"(?:[ \t\r\n\"'=:>,\\]|</(?i:name|key)>|<(?i:value|string|uuid)>)+"
        r"(?i:u)?(?P<secret>\{?(?:" + UUID + "|" + HEX32 + r")\}?)",
        ("session",),
        (
            "session_id=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "'secure_session_id': '8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90'",
            "SessionID: 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "SecureSessionId={8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90}",
            "secure_session_id => 8a5e2c1b0d6f4f3a9c1e7b2d4e6f8a90",
            "<name>secure_session_id</name><value><string>8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90</string>",
            "<key>secure_session_id</key>\n<uuid>8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90</uuid>",
            "{'secure_session_id':u8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90}",
            "session id\n8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
        ),
        (
            "your session is 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90 minutes old?",
            "agent_id=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "what is a session id? 8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90 is my avatar",
        ),
    ),
    Rule(
        "grid-login-hash",
        r"\$1\$[0-9a-fA-F]{32}\b",
        ("$1$",),
        ("passwd=$1$5f4dcc3b5aa765d61d8327deb882cf99", "$1$5F4DCC3B5AA765D61D8327DEB882CF99"),
        ("it cost $1 $2 $3", "$1$abc"),
    ),
    # -- URLs carrying credentials ---------------------------------------------------
    # `scheme://user:pass@host`, `//:pass@host` (empty user), `//u:p@ss@host` (a raw
    # `@` in the password: the userinfo runs to the last `@` before the host).
    Rule(
        "url-userinfo",
        r"(?:\b[a-zA-Z][a-zA-Z0-9+.\-]*:)?\\?/\\?/(?P<secret>[^\s/?#@:\"'<>\[\]]*:[^\s/?#\"'<>\[\]]+)@[^\s/?#@\"'<>]",
        ("//", "\\/\\/"),
        (
            "https://bob:hunter2@example.org/x",
            "redis://default:s3cr3tP4ss@cache.internal:6379/0",
            "redis://:s3cr3tP4ss@cache.internal:6379/0",
            "//alice:s3cr3t@files.example.org/",
            "https://alice:p4ss@w0rd@files.example.org/",
        ),
        ("mailto:someone@example.org", "https://example.org/@someone", "http://host:8080/path"),
    ),
    Rule(
        "slack-webhook",
        r"https?://hooks\.slack\.com/(?:services|workflows|triggers)/" + VALUE + r"+",
        ("hooks.slack.com",),
        ("https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",),
        ("post it in the slack channel",),
    ),
    Rule(
        "discord-webhook",
        r"https?://(?:\w+\.)?discord(?:app)?\.com/api/(?:v\d+/)?webhooks/\d+/" + VALUE + r"+",
        ("/webhooks/",),
        (
            "https://discord.com/api/webhooks/123456789012345678/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        ("https://discord.gg/gridparty",),
    ),
    Rule(
        "url-token-param",
        r"[?&;](?i:access_token|refresh_token|id_token|auth_token|token|api_key|apikey|key|"
        r"client_secret|secret|password|passwd|pwd|sig|signature|x-amz-signature|"
        r"x-amz-credential|x-amz-security-token|auth|session|sessionid|session_id|"
        r"[a-z0-9_.\-]*(?:token|secret|password|api_?key))"
        r"=(?P<secret>[^&\s#\"'<>\[\]]+)"
        # an OAuth `code` is long and random; `?code=promo2024` is a coupon
        r"|[?&;](?i:code)=(?P<secret_code>[^&\s#\"'<>\[\]]{16,})",
        ("=",),
        (
            "https://api.example.com/v1/items?token=abc123def456&page=2",
            "https://maps.googleapis.com/maps/api/js?key=AIzaSyD-not-a-real-key-000",
            "https://bucket.s3.amazonaws.com/f.png?X-Amz-Signature=3b1f00c0ffee&X-Amz-Expires=60",
            "http://sim.example.org:9000/?session=8a5e2c1b-0d6f-4f3a-9c1e-7b2d4e6f8a90",
            "https://acct.blob.core.windows.net/c/f?sv=2022-11-02&se=2030&sig=q8Zx%2Bw2rT9vB4nM1k%3D",
        ),
        ("https://example.org/search?q=sandbox&page=2", "https://example.org/?keyboard=us"),
    ),
    # -- connection strings -------------------------------------------------------------
    Rule(
        "azure-connection-key",
        r"(?i:\b(?:account_?key|shared_?access_?key|shared_?access_?signature))[ \t]*=[ \t]*"
        r"(?P<secret>[^;\s\"'<>]+)",
        ("accountkey", "account_key", "sharedaccess", "shared_access"),
        (
            "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=q8Zx+w2rT9vB4nM1k==;EndpointSuffix=core.windows.net",
            "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey=q8Zxw2rT9vB4=",
            "BlobEndpoint=https://x.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=q8Zx%2B",
        ),
        ("SharedAccessKeyName=RootManageSharedAccessKey", "the account key is in the portal"),
    ),
    # -- HTTP credentials -------------------------------------------------------------
    # Also the quoted header pairs of code: `"Authorization": "..."`, LSL's
    # `[HTTP_CUSTOM_HEADER, "Authorization", "Bearer ..."]`.
    Rule(
        "authorization-header",
        r"(?i:\b(?:proxy-)?authorization)(?:\\*[\"'])?[ \t]*(?::=|=>|[:=,])[ \t]*(?:\\*[\"'])?"
        # any scheme word (Bot, SharedKey, JWT, AWS4-HMAC-SHA256...) and the credential
        # after it, with its `, k=v` parameters; or a lone credential that looks made
        r"(?P<secret>[A-Za-z][A-Za-z0-9_\-]*[ \t]+"
        + _AUTH_CRED
        + r"(?:,[ \t]*"
        + _AUTH_CRED
        + r")*"
        r"|(?i:bearer|basic|token|digest|negotiate|apikey|sso-key)[ \t]+[^\s\"'\\,;]+"
        r"|" + MIXED + r")",
        ("authorization",),
        (
            "Authorization: Basic Ym9iOmh1bnRlcjI=",
            'curl -H "Authorization: token 0123456789abcdef0123" https://api.example.org',
            'llHTTPRequest(u, [HTTP_CUSTOM_HEADER, "Authorization", "Bearer q8Zxw2rT9vB4nM1k"], "")',
            '{"Authorization": "Bearer q8Zxw2rT9vB4nM1k"}',
        ),
        ("authorization is needed for that parcel",),
    ),
    # Redis and .netrc: `requirepass <pw>`, `AUTH <pw>`, `redis-cli -a <pw>`,
    # `machine h login bob password <pw>`.
    Rule(
        "redis-auth",
        r"(?:(?i:\brequirepass|\bmasterauth)[ \t]+(?P<secret>" + VALUE + r"+)"
        r"|(?:^|[\s\"'`>(\[{,;:=])(?-i:AUTH|auth)[ \t]+(?:[A-Za-z0-9_\-]+[ \t]+)?(?P<secret_auth>"
        + MIXED
        + r")"
        r"|(?i:redis-cli)[^\n]*?[ \t]-a[ \t]+(?P<secret_cli>" + VALUE + r"+)"
        r"|(?i:\blogin)[ \t]+\S+[ \t]+(?i:password)[ \t]+(?P<secret_netrc>" + VALUE + r"+))",
        ("requirepass", "masterauth", "auth", "redis-cli", "login"),
        (
            "requirepass q8Zxw2rT9vB4",
            "AUTH q8Zxw2rT9vB4",
            "AUTH default q8Zxw2rT9vB4",
            "redis-cli -h cache -a q8Zxw2rT9vB4 ping",
            "machine api.example.org login bob password q8Zxw2rT9vB4",
        ),
        ("AUTH required for this command", "login with your password first"),
    ),
    # `docker login -u bob -p <pw>`, `az login ... -p <pw>`; SQL `IDENTIFIED BY '<pw>'`;
    # Azure AD client secrets (`xxx8Q~...`, 40 characters).
    Rule(
        "login-password",
        r"(?:(?i:\blogin\b)[^\n]{0,200}?[ \t]-p[ \t]+(?:\\*[\"'])?(?P<secret>" + MIXED + r")"
        r"|(?i:\bidentified[ \t]+(?:with[ \t]+[A-Za-z0-9_]+[ \t]+)?by)[ \t]+(?i:password[ \t]+)?"
        r"(?:'(?P<secret_sq>[^'\n]+)'|\"(?P<secret_dq>[^\"\n]+)\"|(?P<secret_bare>"
        + MIXED
        + r")))",
        ("login", "identified"),
        (
            "docker login -u bob -p q8Zxw2rT9vB4 registry.example.org",
            "CREATE USER 'bob'@'%' IDENTIFIED BY 'q8Zxw2rT9vB4';",
        ),
        ("after login: ssh -p 2222 host", "identified by her voice"),
    ),
    Rule(
        "azure-client-secret",
        r"(?:\b|[^A-Za-z0-9_\-.~])(?P<secret>[A-Za-z0-9_\-.~]{3}[0-9]Q~[A-Za-z0-9_\-.~]{31,34})",
        ("q~",),
        ("CtL8Q~ZPf7s-tg7NvlE3Lar-uSrjLnonWKTn9UGK",),
        ("Q~ is a tilde after a Q",),
    ),
    Rule(
        "bearer-token",
        r"(?i:\bbearer)[ \t]+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)",
        ("bearer",),
        ("use Bearer abcdefghijklmnop1234 for it", "bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        ("the bearer of this notecard", "ring bearer duties"),
    ),
    # Cookies: the list of name=value pairs (what follows it is left to the other
    # rules: `Cookie: a=b api_key = "..."`, a PEM block on the same line).
    Rule(
        "cookie-header",
        r"(?i:(?:set-)?cookie)(?:\\*[\"'])?[ \t]*[:,][ \t]*(?:\\*[\"'])?"
        r"(?P<secret>" + COOKIE_PAIR + r"(?:[ \t]*;[ \t]*" + COOKIE_PAIR + r")*;?)",
        ("cookie",),
        (
            "Cookie: sessionid=abc123; csrftoken=def456",
            "curl -b x -H 'Cookie: a=1; session_token=q8Zxw2rT9vB4' https://h",
            "Set-Cookie: sid=q8Zxw2rT9vB4; Path=/; HttpOnly",
        ),
        ("the cookie jar is on the table", "cookie: chocolate chip"),
    ),
    Rule(
        "credential-header",
        r"(?i:\b(?:x-api-key|api-key|x-auth-token|x-access-token|private-token|x-goog-api-key|"
        r"x-token|x-vault-token|x-functions-key|ocp-apim-subscription-key|x-api-token|"
        r"x-gitlab-token|x-github-token|x-hub-signature(?:-256)?|x-secret|x-session-token|x-auth))"
        r"(?:\\*[\"'])?[ \t]*(?::=|=>|[:=,])[ \t]*(?:\\*[\"'])?"
        # (a YAML block indicator `|` is no value: the block under it is, for secret-assignment)
        r"(?P<secret>(?:(?i:bearer|basic|token)[ \t]+)?[^\s\"'\\,;\[\]>|][^\s\"'\\,;\[\]]*)",
        ("key", "token", "secret", "signature"),
        (
            "curl -H 'X-Api-Key: 8f14e45fceea167a5a36dedd4bea2543' https://api.example.org",
            "PRIVATE-TOKEN: glp-not-a-real-one-123",
            '[HTTP_CUSTOM_HEADER, "X-Api-Key", "q8Zxw2rT9vB4nM1k"]',
        ),
        ("my api-key question: where do I get one?",),
    ),
    Rule(
        "curl-user",
        r"(?:\s|^)(?:-u|--user)[ \t=]+[\"']?(?P<secret>[^\s\"':]+:[^\s\"']+)",
        ("-u", "--user"),
        ("curl -u admin:changeme https://example.org", "curl --user=bob:pa55word http://h"),
        ("use -u to set the user", "sign-up: open"),
    ),
    # -- provider keys -------------------------------------------------------------------
    # A distinctive prefix needs no word boundary: `key:ghp_...`, `tokenghp_...`.
    Rule(
        "anthropic-key",
        r"sk-ant-[A-Za-z0-9_\-]{20,}",
        ("sk-ant-",),
        ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789_ABCDEFG-hijk",),
        ("sk-ant-short",),
    ),
    Rule(
        "openai-key",
        r"(?:sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{16,}|\bsk-[A-Za-z0-9_\-]{20,})",
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
        r"AIza[0-9A-Za-z_\-]{30,}",
        ("aiza",),
        ("AIzaSyA1234567890abcdefghijklmnopqrstuv",),
        ("AIzawesome idea",),
    ),
    Rule(
        "google-oauth",
        r"(?:GOCSPX-[A-Za-z0-9_\-]{20,}|ya29\.[A-Za-z0-9_\-.]{20,}|1//0[A-Za-z0-9_\-]{20,})",
        ("gocspx-", "ya29.", "1//0"),
        (
            "GOCSPX-q8Zxw2rT9vB4nM1kLp0aZq8xW2r",
            "ya29.a0AfH6SMq8Zxw2rT9vB4nM1kLp0aZq8xW2rT9vB4",
            "refresh_token 1//0gq8Zxw2rT9vB4nM1kLp0aZq8xW2rT9vB4",
        ),
        ("ya29 is a bus line", "1//0 is not a fraction"),
    ),
    Rule(
        "huggingface-token",
        r"(?:hf|api_org)_[A-Za-z0-9]{30,}",
        ("hf_", "api_org_"),
        ("hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "api_org_abcdefghijklmnopqrstuvwxyzABCD"),
        ("hf_ is the prefix of Hugging Face tokens",),
    ),
    Rule(
        "github-token",
        r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
        ("ghp_0123456789abcdefghijklmnopqrstuvwxyz", "ghs_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"),
        ("ghp_short",),
    ),
    Rule(
        "github-pat",
        r"github_pat_[A-Za-z0-9_]{22,}",
        ("github_pat_",),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",),
        ("github_pat_ tokens are fine-grained",),
    ),
    Rule(
        "gitlab-token",
        r"gl(?:pat|dt|rt|ptt|oas|soat|cbt|ft|imt|agent|ffct|wt)-[A-Za-z0-9_\-]{20,}",
        (
            "glpat-",
            "gldt-",
            "glrt-",
            "glptt-",
            "gloas-",
            "glsoat-",
            "glcbt-",
            "glft-",
            "glimt-",
            "glagent-",
            "glffct-",
            "glwt-",
        ),
        ("glpat-abcdefghij0123456789", "glrt-q8Zxw2rT9vB4nM1kLp0a", "gldt-q8Zxw2rT9vB4nM1kLp0a"),
        ("glpat- is GitLab's prefix",),
    ),
    Rule(
        "slack-token",
        r"(?:xox[a-z]-[A-Za-z0-9\-]{10,}|xapp-\d+-[A-Za-z0-9\-]{10,})",
        ("xox", "xapp-"),
        (
            "xoxb-123456789012-123456789012-abcdefghijklmnopqrstuvwx",
            "xoxp-1234567890-abcdef",
            "xapp-1-A0123456789-1234567890123-abcdef0123456789",
        ),
        ("xoxo, see you tomorrow",),
    ),
    Rule(
        "stripe-key",
        r"(?:(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9+/=]{20,})",
        ("_live_", "_test_", "whsec_"),
        (
            "sk_live_0123456789abcdefABCDEF",
            "rk_test_abcdefghijklmnopqrstuvwx",
            "whsec_q8Zxw2rT9vB4nM1kLp0aZq8x",
        ),
        ("run_test_suite before you push",),
    ),
    # An access key id with its 40-character secret key close after it (`AKIA... /
    # wJalr...`, credentials.csv, console table and `aws sts` outputs): both go.
    Rule(
        "aws-key-pair",
        r"(?:\b|[a-z0-9_])(?P<secret>(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"
        r"[ \t:/,|;=\"']{1,6}(?:[0-9TZ:.\-]{10,30}[ \t,|;]{1,3})?[A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+]|\z)",
        ("akia", "asia", "abia", "acca"),
        (
            "AKIAIOSFODNN7EXAMPL3 / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ",
            "AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "CREDENTIALS\tASIAY34FZKBOKMUTVV7A\t2030-01-01T00:00:00Z\twJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ("the access key id starts with AKIA, the secret key is 40 characters",),
    ),
    Rule(
        "aws-access-key",
        r"(?:\b|[a-z0-9_])(?P<secret>(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16})(?:\b|[a-z_])",
        ("akia", "asia", "abia", "acca"),
        ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id = ASIAY34FZKBOKMUTVV7A"),
        ("ASIA is a continent", "AKIAIOSFODNN7EXAMPLEX is too long"),
    ),
    Rule(
        "aws-secret-key",
        r"(?i:aws_?secret_?(?:access_?)?key)(?:\\*[\"'])?[ \t]*[:=][ \t]*(?:\\*[\"'])?(?P<secret>[A-Za-z0-9/+=]{40})"
        # `aws configure`'s prompt, a console label: `Secret access key [None]: ...`
        r"|(?i:secret[ _]access[ _]key)[ \t]*(?:\[[^\]\n]{0,24}\])?[ \t]*[:=\t][ \t]*(?P<secret_prompt>[A-Za-z0-9/+]{40})",
        ("secret",),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "AWS Secret Access Key [None]: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ("where is the aws secret key setting?",),
    ),
    Rule(
        "sendgrid-key",
        r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
        ("sg.",),
        ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",),
        ("SG.1 is the first region",),
    ),
    Rule(
        "twilio-key",
        r"(?:\b|[0-9a-z_])(?P<secret>(?:SK|AC)[0-9a-f]{32})(?:\b|[G-Zg-z_])",
        ("sk", "ac"),
        ("twilio SK0123456789abcdef0123456789abcdef", "AC0123456789abcdef0123456789abcdef"),
        ("SKU 12345",),
    ),
    Rule(
        "npm-token",
        r"npm_[A-Za-z0-9]{30,}",
        ("npm_",),
        ("npm_abcdefghijklmnopqrstuvwxyz0123456789",),
        ("npm_config_cache is a setting",),
    ),
    Rule(
        "pypi-token",
        r"pypi-[A-Za-z0-9_\-]{30,}",
        ("pypi-",),
        ("pypi-AgEIcHlwaS5vcmcCJDq8Zxw2rT9vB4nM1kLp0aZq8xW2rT9vB4",),
        ("pypi-server is a package",),
    ),
    Rule(
        "telegram-bot-token",
        r"\b\d{8,10}:AA[A-Za-z0-9_\-]{33}\b",
        (":aa",),
        ("123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0",),
        ("meet at 12:AA gate",),
    ),
    Rule(
        "discord-bot-token",
        r"(?:\b|[a-z0-9_])(?P<secret>[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40})",
        (".",),
        ("MTE2NzA4OTk4NzY1NDMyMTAxMg.GxYz12.q8Zxw2rT9vB4nM1kLp0aZq8xW2rT9vB4",),
        ("N. is a name, not a token",),
    ),
    # A JWT, signed or not (`eyJ...eyJ...` with an empty signature).
    Rule(
        "jwt",
        r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
        ("eyj",),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "eyJhbGciOiJub25lIn0.eyJzdWIiOiJib2IifQ.",
        ),
        ("eyJ is how base64 JSON starts",),
    ),
    # -- generic assignments and phrases, last: everything specific has had its turn ---
    # `<password>...</password>`, `<ns:AccountKey>...`: an element named like a secret.
    # A name/value pair naming a secret: k8s env lists (`- name: DB_PASSWORD` then
    # `value: ...`), ECS JSON, .NET `<add key="DB_PASSWORD" value="..."/>`, Ant/Maven
    # `<property name="password" value="..."/>`, `<entry key="password">...</entry>`.
    Rule(
        "secret-name-value",
        r"(?i:\b(?:name|key))[\"']?[ \t]*[:=][ \t]*[\"']?(?:"
        + ANY_NAME
        + r")[\"']?(?:[ \t,]*(?:\r?\n[ \t]*)?[\"']?(?i:value)[\"']?[ \t]*[:=][ \t]*(?:"
        + quoted("secret_nv")
        + r"|(?P<secret_nvb>"
        + MARKED
        + r"))|"
        + OPEN_TAG_REST
        + r"(?P<secret_entry>[^<\n]+)<)"
        # a suffixed name (`AuthToken_old`): the value must look machine-made
        + r"|(?i:\b(?:name|key))[\"']?[ \t]*[:=][ \t]*[\"']?(?:"
        + LOOSE_NAME
        + r")[\"']?(?:[ \t,]*(?:\r?\n[ \t]*)?[\"']?(?i:value)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<secret_nvl>"
        + MIXED
        + r")|"
        + OPEN_TAG_REST
        + r"(?P<secret_entryl>"
        + MIXED
        + r")<)"
        # HTML/XML attributes in one tag, either order: `<input type="password"
        # value="...">`, `<input value="..." name="api_key">`
        + r"|<[^<>\n]*?[ \t](?i:name|key|type|id)[ \t]*=[ \t]*[\"']?(?:"
        + ANY_NAME
        + r")[\"']?(?:[ \t][^<>\n]*?)?[ \t](?i:value)[ \t]*=[ \t]*(?:"
        + quoted("secret_attr")
        + r"|(?P<secret_attrb>"
        + MARKED
        + r"))"
        + r"|<[^<>\n]*?[ \t](?i:value)[ \t]*=[ \t]*(?:"
        + quoted("secret_rattr")
        + r"|(?P<secret_rattrb>"
        + MARKED
        + r"))(?:[ \t][^<>\n]*?)?[ \t](?i:name|key|type|id)[ \t]*=[ \t]*[\"']?(?:"
        + ANY_NAME
        + r")[\"'/> \t]",
        ("value", "key", "name"),
        (
            '<input type="password" name="pw" value="q8Zxw2rT9vB4">',
            "<input value='q8Zxw2rT9vB4' type='password'>",
            "- name: DB_PASSWORD\n  value: q8Zxw2rT9vB4",
            '{"name": "DB_PASSWORD", "value": "q8Zxw2rT9vB4"}',
            '<add key="DB_PASSWORD" value="q8Zxw2rT9vB4" />',
            '<property name="password" value="q8Zxw2rT9vB4"/>',
            '<entry key="password">q8Zxw2rT9vB4</entry>',
        ),
        (
            '{"name": "DB_HOST", "value": "db.example.org"}',
            '<add key="token_name" value="Gold Coin" />',
        ),
    ),
    Rule(
        "secret-element",
        r"<(?:[A-Za-z_][\w.\-]*:)?" + ANY_NAME + r"(?:[ \t][^>]*)?>(?P<secret>[^<]+)<\\?/"
        # a suffixed name (`<password_prod>`): the value must look machine-made
        r"|<(?:[A-Za-z_][\w.\-]*:)?" + LOOSE_NAME + r">(?P<secret_loose>" + MIXED + r")<\\?/",
        ("pass", "pwd", "secret", "key", "token", "credential"),
        ("<password>hunter2</password>", "<aws_session_secret>q8Zx</aws_session_secret>"),
        ("<password/>", "<token>", "<name>password</name>"),
    ),
    # CLI flags: `--password s3cret`, `--client-secret=x`, mysql's glued `-pS3cret`.
    Rule(
        "cli-secret-flag",
        r"(?:^|[\s\"'`])(?:--?(?:"
        + NAME
        + r"|pass)(?:[ \t]*=[ \t]*|[ \t]+)(?:\\*[\"'])?(?P<secret>"
        + VALUE
        + r"+)"
        r"|-p(?P<secret_glued>[A-Za-z]" + VALUE + r"*[0-9#$%&*+\-/@^|~=!]" + VALUE + r"*"
        r"|[0-9#$%&*+\-/@^|~=!]" + VALUE + r"*[A-Za-z]" + VALUE + r"*))",
        ("--", "-p"),
        (
            "mysql -u root --password s3cr3t -h db",
            "app --client-secret=q8Zxw2rT9vB4",
            "mysql -uroot -pS3cret! db",
            "vault login --token 'hvs.q8Zxw2rT9vB4'",
        ),
        ("gcc -pthread -pedantic x.c", "ssh -p 2222 host", "--password-file /run/secret"),
    ),
    Rule(
        "secret-assignment",
        r"(?:(?:"
        + ANY_NAME
        + r")"
        + NAME_END
        + ASSIGN
        + r"(?:(?:\[[ \t]*)?"
        + quoted("secret_q")
        + "|"
        + YAML_BLOCK
        # a word-like value followed by `(` or `[` is code: `getpass()`,
        # `os.environ[...]`; an identifier with digits followed by `(` is dropped
        # after the match (gridmem/redaction.py), since it is a call too
        + r"|(?:\\*[\"'`])?(?P<secret_bare>(?:(?i:bearer|basic|digest|token)[ \t]+)?"
        + MARKED
        + r")"
        + r"|(?:\\*[\"'`])?(?P<secret_word>(?:(?i:bearer|basic|digest|token)[ \t]+)?"
        + WORDY
        + r")"
        + NOT_CODE
        + r"))"
        # any other suffix (`password_prod`, `PrivateKey_old`): the value must look
        # machine-made, letters with digits or symbols, quoted or not
        + r"|(?:"
        + LOOSE_NAME
        + "|"
        + SHORT_NAME
        + r")"
        + NAME_END
        + ASSIGN
        + r"(?:(?:\\*[\"'`]){0,3}(?P<secret_loose>"
        + MIXED
        + r")"
        # or a YAML block scalar whose first line is such a value
        + r"|[|>][+\-]?[ \t]*\r?\n(?P<secret_loose_yaml>[ \t]+"
        + MIXED
        + r"[^\r\n]*(?:\r?\n|\z)(?:[ \t]+[^\r\n]*(?:\r?\n|\z))*))"
        # quoted header pairs of LSL and code: "X-Api-Key", "..."
        + r"|[\"'](?:"
        + ANY_NAME
        + r")[\"'][ \t]*,[ \t]*"
        + quoted("secret_pair"),
        ("pass", "pwd", "secret", "key", "token", "credential", "auth", "pw"),
        (
            "password=hunter2",
            "auth_token: Basic dXNlcjpwYXNzd29yZA==",
            "PASSWORD: correct-horse-battery",
            'api_key = "0123456789abcdef"',
            "{'token': 'tok_1234567890'}",
            'string pwd = "letmein!";',
            "DB_PASSWORD=q8Zxw2rT9vB4",
            "export GITHUB_TOKEN=q8Zxw2rT9vB4",
            "aws_session_token = q8Zxw2rT9vB4",
            "dbPassword=q8Zxw2rT9vB4",
            "clientSecret: q8Zxw2rT9vB4",
            "password1=q8Zxw2rT9vB4",
            "os.environ['DB_PASSWORD'] = 'q8Zxw2rT9vB4'",
            '{"SecretAccessKey": "q8Zx/w2rT9vB4"}',
            '"password": "ab\\"cd"',
            '{\\"password\\": \\"q8Zxw2rT9vB4\\"}',
            'string OPENAI_KEY = "q8Zxw2rT9vB4";',
            "password:\n  q8Zxw2rT9vB4",
            "password: |\n  q8Zxw2rT9vB4\n  more\n",
            'password = """q8Zx w2rT9vB4"""',
            "password: `q8Zxw2rT9vB4`",
            "api key: q8Zxw2rT9vB4",
            "export password_prod=q8Zx%w2rT9vB4",
            "{'PrivateKey_old': 'q8Zxw2rT9vB4'}",
            "private_key_prod: |\n  q8Zx*w2rT9vB4\nnext: 1",
            'token_old = """q8Zx%w2rT9vB4"""',
        ),
        ("password is required", "the api key page", "token: ok", "key = llGetOwner"),
    ),
    Rule(
        "password-phrase",
        r"(?i:\b(?:(?:my|the|our|your|his|her|their)[ \t]+)?(?:password|passwd|pw|passcode|passphrase|"
        r"pin|api[ _\-]?key|secret[ _\-]?key|access[ _\-]?key|token|secret)[ \t]+(?:is|was)[ \t]*:?)"
        # the value may be quoted or a code span, or on the next line after `is:`
        r"(?:[ \t]+|[ \t]*\r?\n[ \t]*)(?:\\*[\"'`])?(?P<secret>" + PHRASE_VALUE + ")",
        ("pass", "pw", "pin", "key", "token", "secret"),
        (
            "my password is Tr0ub4dor&3",
            "the passcode was 8812-ab",
            "api key is q8Zx!w2rT9vB4",
            'the password is "q8Zxw2rT9vB4"',
            "the password is: `q8Zxw2rT9vB4`",
            "password is:\nq8Zxw2rT9vB4",
        ),
        (
            "the password is ok",
            "my pin is 42",
            "my password is too weak lol",
            "password is required.",
        ),
    ),
)
