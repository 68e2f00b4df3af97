"""The secret corpus: one generator per family of secret, and text that must survive.

Every generator makes a fresh instance from a seed and knows what it made: the
pasted text and the secrets inside it, which the tests then look for in what
redaction (and the store, and the wire) kept. Nothing here asks the redaction
rules which part is secret, so a narrowed rule cannot narrow the expectation.

Secrets are drawn from a seeded `random.Random`, never from Hypothesis text
strategies: a shrunk seed is still a random seed, so a secret is always long and
random (16+ characters of mixed case and digits, or a UUID) and cannot look like
one of the store's own identifiers (an old leak check failed on `_session`
matching the published limit `max_active_sessions`).

`FAMILIES` maps a family name to `make(rng) -> Case`; `WRAPPERS` are the
obfuscations an attacker applies to any of them (invisible characters inside
the secret, full-width look-alikes, Unicode spaces as separators); `BENIGN`
maps a kind of ordinary grid text to `make(rng) -> str`, text that must come
out of redaction byte for byte.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace

from hypothesis import strategies as st

UPPER, LOWER, DIGITS = string.ascii_uppercase, string.ascii_lowercase, string.digits
ALNUM = UPPER + LOWER + DIGITS
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"

# A secret "survives" when any run of this many of its characters is still there.
WINDOW = 10


@dataclass(frozen=True)
class Case:
    """One pasted instance of a family: the text and every secret that must vanish."""

    family: str
    text: str
    secrets: tuple[str, ...]


Rng = random.Random
Maker = Callable[[Rng], Case]


# -- random parts -----------------------------------------------------------------------


def rand(r: Rng, n: int, alphabet: str = ALNUM) -> str:
    """n random characters; with a mixed alphabet, at least one capital, small letter and
    digit, so a secret is never an ordinary word."""
    chars = [r.choice(alphabet) for _ in range(n)]
    for i, kind in enumerate((UPPER, LOWER, DIGITS)):
        pool = "".join(c for c in alphabet if c in kind)
        if pool and n >= 3 * (i + 1):
            chars[3 * i + 1] = r.choice(pool)
    return "".join(chars)


def rand_value(r: Rng, low: int = 16, high: int = 28) -> str:
    """A password-like value: letters, digits and a few symbols, alphanumeric at both ends."""
    n = r.randint(low, high)
    middle = rand(r, n - 2, ALNUM + "-_.+!%*")
    return rand(r, 1) + middle + r.choice(DIGITS)


def rand_uuid(r: Rng) -> str:
    return str(uuid.UUID(int=r.getrandbits(128), version=4))


def b64(r: Rng, nbytes: int, urlsafe: bool = False) -> str:
    raw = r.randbytes(nbytes)
    out = base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)
    return out.decode("ascii")


def b64url_json(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def one(r: Rng, *options: str) -> str:
    return r.choice(options)


# -- provider tokens ------------------------------------------------------------------------


_OPEN, _CLOSE = "\x01", "\x02"


def sec(r: Rng, n: int, alphabet: str = ALNUM) -> str:
    """A random part of a token, marked as secret; the constant prefix around it is not
    (a prefix shared by every instance cannot tell one instance's leak from another's)."""
    return _OPEN + rand(r, n, alphabet) + _CLOSE


def _unmark(marked: str) -> tuple[str, tuple[str, ...]]:
    secrets, text, rest = [], "", marked
    while _OPEN in rest:
        before, rest = rest.split(_OPEN, 1)
        secret, rest = rest.split(_CLOSE, 1)
        text += before + secret
        secrets.append(secret)
    return text + rest, tuple(secrets)


def _token(family: str, make: Callable[[Rng], str]) -> tuple[str, Maker]:
    """A family of tokens pasted in a short phrase; `make` marks their random parts."""

    def maker(r: Rng) -> Case:
        token, secrets = _unmark(make(r))
        lead = one(r, "", "here: ", "my key ", "use ", "token ", "key:", "=")
        return Case(family, lead + token, secrets)

    return family, maker


def _jwt_payload(r: Rng) -> tuple[str, str]:
    """A payload and its secret part: past the first 12 characters (the encoded `{"sub": "`,
    the same in every token)."""
    payload = b64url_json({"sub": rand(r, 16), "name": rand(r, 12), "iat": r.randint(1, 2**31)})
    return payload, payload[12:]


def _jwt(r: Rng) -> str:
    header = b64url_json({"alg": one(r, "HS256", "RS256", "ES256"), "typ": "JWT"})
    payload, secret = _jwt_payload(r)
    head = payload[: len(payload) - len(secret)]
    return f"{header}.{head}{_OPEN}{secret}{_CLOSE}.{sec(r, 43, B64URL)}"


def _jwt_unsigned(r: Rng) -> Case:
    header = b64url_json({"alg": "none"})
    payload, secret = _jwt_payload(r)
    text = f"{header}.{payload}."
    return Case("jwt-unsigned", one(r, "jwt: ", "id_token ", "") + text, (secret,))


TOKEN_FAMILIES: dict[str, Maker] = dict(
    [
        _token("github", lambda r: one(r, "ghp_", "gho_", "ghu_", "ghs_", "ghr_") + sec(r, 36)),
        _token(
            "github-pat",
            lambda r: "github_pat_" + sec(r, 22) + "_" + sec(r, 59),
        ),
        _token("openai", lambda r: "sk-" + sec(r, 48)),
        _token(
            "openai-proj",
            lambda r: (
                one(r, "sk-proj-", "sk-svcacct-", "sk-admin-")
                + sec(r, 40, B64URL)
                + "T3BlbkFJ"
                + sec(r, 40, B64URL)
            ),
        ),
        _token("anthropic", lambda r: "sk-ant-api03-" + sec(r, 93, B64URL) + "AA"),
        _token(
            "slack",
            lambda r: (
                one(r, "xoxb-", "xoxp-")
                + f"{r.randint(10**10, 10**12)}-{r.randint(10**10, 10**12)}-"
                + sec(r, 24)
            ),
        ),
        _token(
            "slack-app",
            lambda r: (
                f"xapp-1-A{rand(r, 10, UPPER + DIGITS)}-{r.randint(10**12, 10**13)}-"
                + sec(r, 64, HEX)
            ),
        ),
        _token("aws-access-key", lambda r: one(r, "AKIA", "ASIA") + sec(r, 16, UPPER + DIGITS)),
        _token("google-api-key", lambda r: "AIza" + sec(r, 35, B64URL)),
        _token(
            "gitlab",
            lambda r: one(r, "glpat-", "gldt-", "glrt-", "glptt-", "gloas-") + sec(r, 20, B64URL),
        ),
        _token("stripe-webhook", lambda r: "whsec_" + sec(r, 32)),
        _token("google-oauth-secret", lambda r: "GOCSPX-" + sec(r, 28, B64URL)),
        _token("google-oauth-token", lambda r: "ya29." + sec(r, 120, B64URL)),
        _token("jwt", _jwt),
        _token("npm", lambda r: "npm_" + sec(r, 36)),
        _token("pypi", lambda r: "pypi-AgEIcHlwaS5vcmc" + sec(r, 60, B64URL)),
        _token(
            "stripe",
            lambda r: one(r, "sk_live_", "rk_live_", "sk_test_", "rk_test_") + sec(r, 24),
        ),
        _token("sendgrid", lambda r: f"SG.{sec(r, 22, B64URL)}.{sec(r, 43, B64URL)}"),
        _token("huggingface", lambda r: one(r, "hf_", "api_org_") + sec(r, 34)),
        _token(
            "slack-webhook",
            lambda r: (
                f"https://hooks.slack.com/services/T{rand(r, 8, UPPER + DIGITS)}/"
                f"B{rand(r, 8, UPPER + DIGITS)}/{sec(r, 24)}"
            ),
        ),
        _token(
            "discord-webhook",
            lambda r: (
                f"https://discord.com/api/webhooks/{r.randint(10**17, 10**18)}/"
                + sec(r, 68, B64URL)
            ),
        ),
        _token("login-hash", lambda r: "$1$" + sec(r, 32, HEX)),
        _token("google-refresh-token", lambda r: "1//0" + sec(r, 100, B64URL)),
        _token("twilio", lambda r: "SK" + sec(r, 32, HEX)),
        _token(
            "discord-bot-token",
            lambda r: f"M{sec(r, 23, B64URL)}.{rand(r, 6, B64URL)}.{sec(r, 38, B64URL)}",
        ),
    ]
)
TOKEN_FAMILIES["jwt-unsigned"] = _jwt_unsigned


# -- key blocks ------------------------------------------------------------------------------


def _b64_lines(r: Rng, count: int, width: int = 64) -> list[str]:
    return [rand(r, width, B64) for _ in range(count)]


def _pem(r: Rng) -> Case:
    kind = one(r, "", "RSA ", "EC ", "DSA ", "ENCRYPTED ")
    lines = _b64_lines(r, r.randint(1, 4))
    body = "\n".join(lines)
    begin, end = f"-----BEGIN {kind}PRIVATE KEY-----", f"-----END {kind}PRIVATE KEY-----"
    if r.random() < 0.2:  # retyped: lower case, or spaces inside the dashes
        begin, end = one(r, begin.lower(), begin.replace("-----", "----- ", 1)), end.lower()
    text = f"{begin}\n{body}\n{end}"
    if r.random() < 0.2:  # pasted, cut off before its end line
        text = f"{begin}\n{body}"
    return Case("pem", text, tuple(lines))


def _openssh(r: Rng) -> Case:
    lines = _b64_lines(r, r.randint(1, 4), 70)
    body = "b3BlbnNzaC1rZXktdjEAAAAA" + "\n".join(lines)
    text = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n-----END OPENSSH PRIVATE KEY-----"
    return Case("openssh", text, tuple(lines))


def _pgp(r: Rng) -> Case:
    lines = _b64_lines(r, r.randint(1, 4))
    version = one(r, "", "Version: GnuPG v2\n")
    text = (
        f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n{version}\n"
        + "\n".join(lines)
        + f"\n={rand(r, 4, B64)}\n-----END PGP PRIVATE KEY BLOCK-----"
    )
    return Case("pgp", text, tuple(lines))


def _putty(r: Rng) -> Case:
    private = _b64_lines(r, r.randint(1, 2))
    text = (
        f"PuTTY-User-Key-File-{one(r, '2', '3')}: ssh-{one(r, 'ed25519', 'rsa')}\n"
        "Encryption: none\nComment: me@home\nPublic-Lines: 1\n"
        f"AAAAC3NzaC1lZDI1NTE5AAAAI{rand(r, 20, B64)}\n"
        f"Private-Lines: {len(private)}\n" + "\n".join(private) + "\n"
        f"Private-MAC: {rand(r, 64, HEX)}"
    )
    return Case("putty", text, tuple(private))


def _ssh2(r: Rng) -> Case:
    lines = _b64_lines(r, r.randint(1, 3))
    dashes = one(r, "----", "-----")
    pad = " " if dashes == "----" else ""
    begin = f"{dashes}{pad}BEGIN SSH2 ENCRYPTED PRIVATE KEY{pad}{dashes}"
    end = f"{dashes}{pad}END SSH2 ENCRYPTED PRIVATE KEY{pad}{dashes}"
    text = f'{begin}\nComment: "rsa-key-20240101"\n' + "\n".join(lines) + f"\n{end}"
    return Case("ssh2", text, tuple(lines))


BLOCK_FAMILIES: dict[str, Maker] = {
    "pem": _pem,
    "openssh": _openssh,
    "pgp": _pgp,
    "putty": _putty,
    "ssh2": _ssh2,
}


# -- URLs ------------------------------------------------------------------------------------


def _host(r: Rng) -> str:
    return one(
        r, "sim.example.org:9000", "simhost-0a1b2c3d.agni.secondlife.io:12043", "10.0.0.5:9000"
    )


def _capability(r: Rng) -> Case:
    cap = rand_uuid(r)
    path = one(r, f"CAPS/{cap}/", f"CAPS/{cap}0000/", f"caps/{cap}", f"CAPS/EQG/{cap}/",
               f"cap/{cap}", f"cap/{cap}/upload", f"lslhttp/{cap}/", f"lslhttps/{cap}/?q=1")  # fmt: skip
    head = one(r, f"http://{_host(r)}/", f"https://{_host(r)}/", "/")
    return Case("capability-url", one(r, "", "seed cap: ", "url ") + head + path, (cap,))


def _url_param(r: Rng) -> Case:
    name = one(r, "token", "access_token", "api_key", "apikey", "key", "secret", "password",
               "auth", "session", "signature", "client_secret", "X-Amz-Signature", "code")  # fmt: skip
    value = rand(r, r.randint(16, 40))
    query = one(r, f"?{name}={value}", f"?page=2&{name}={value}", f"?a=1&{name}={value}&b=2")
    return Case("url-token-param", f"https://api.example.org/v1/items{query}", (value,))


def _sas(r: Rng) -> Case:
    sig = b64(r, 32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
    url = (
        f"https://{rand(r, 10, LOWER)}.blob.core.windows.net/c/f.png?sv=2021-08-06&ss=b&srt=o"
        f"&sp=r&se=2030-01-01T00:00:00Z&sig={sig}"
    )
    return Case("sas-url", url, (sig,))


def _userinfo(r: Rng) -> Case:
    scheme = one(r, "https", "redis", "postgres", "ftp", "mongodb+srv", "amqp")
    password = rand_value(r)
    form = r.randrange(3)
    if form == 0:  # user:password@
        return Case(
            "url-userinfo",
            f"{scheme}://{one(r, 'bob', 'admin', 'default')}:{password}@db.example.org:5432/x",
            (password,),
        )
    if form == 1:  # an empty user
        return Case("url-userinfo", f"{scheme}://:{password}@cache.internal:6379/0", (password,))
    # a raw @ inside the password
    first, second = rand(r, 16), rand(r, 16)
    return Case("url-userinfo", f"{scheme}://alice:{first}@{second}@files.example.org/", (first, second))  # fmt: skip


URL_FAMILIES: dict[str, Maker] = {
    "capability-url": _capability,
    "url-token-param": _url_param,
    "sas-url": _sas,
    "url-userinfo": _userinfo,
}


# -- credential headers ----------------------------------------------------------------------


def _curl(r: Rng, header: str) -> str:
    return one(
        r,
        header,
        f"curl -H '{header}' https://api.example.org/v1",
        f'curl -s -H "{header}" -d @x.json https://api.example.org',
        f"{header}\r\nAccept: */*",
    )


def _authorization(r: Rng) -> Case:
    token = rand(r, r.randint(20, 40), B64URL + ".~")
    scheme = one(r, "Bearer", "bearer", "Basic", "token", "Token", "Bot", "JWT", "Key", "SSWS")
    name = one(r, "Authorization", "authorization", "Proxy-Authorization")
    return Case("authorization", _curl(r, f"{name}: {scheme} {token}"), (token,))


def _api_key_header(r: Rng) -> Case:
    token = rand(r, r.randint(20, 40))
    name = one(r, "X-Api-Key", "x-api-key", "Api-Key", "X-Auth-Token", "PRIVATE-TOKEN",
               "X-Goog-Api-Key", "X-Access-Token")  # fmt: skip
    return Case("api-key-header", _curl(r, f"{name}: {token}"), (token,))


def _cookie(r: Rng) -> Case:
    named = [(one(r, "session_token", "sessionid", "sid", "auth", "csrftoken", "remember_token",
                  "__Secure-next-auth.session-token", "connect.sid"), rand(r, r.randint(20, 40)))
             for _ in range(r.randint(1, 3))]  # fmt: skip
    plain = [("theme", "dark"), ("lang", "en"), ("a", "1")]
    pairs = named + r.sample(plain, r.randint(0, 3))
    r.shuffle(pairs)
    if all(name != "session_token" for name, _ in pairs) and r.random() < 0.5:
        pairs.append(("session_token", rand(r, 32)))
    cookie = "; ".join(f"{k}={v}" for k, v in pairs)
    secrets = tuple(v for k, v in pairs if (k, v) not in plain)
    header = f"{one(r, 'Cookie', 'cookie', 'Set-Cookie')}: {cookie}"
    return Case("cookie", _curl(r, header), secrets)


HEADER_FAMILIES: dict[str, Maker] = {
    "authorization": _authorization,
    "api-key-header": _api_key_header,
    "cookie": _cookie,
}


# -- name = value -----------------------------------------------------------------------------

BASES = ["password", "passwd", "secret", "token", "api_key", "access_token", "auth_token",
         "client_secret", "secret_key", "private_key", "access_key", "passphrase", "pwd"]  # fmt: skip
PREFIXES = ["db", "mysql_root", "github", "aws_session", "smtp", "admin", "redis", "openai",
            "app", "stripe", "bot", "root"]  # fmt: skip


def _words(name: str) -> list[str]:
    return [w for w in name.split("_") if w]


def secret_name(r: Rng) -> str:
    """A secret-bearing name as people write them: prefixed, suffixed, camel, digits."""
    words = _words(one(r, *BASES))
    if r.random() < 0.6:
        words = _words(one(r, *PREFIXES)) + words
    style = r.randrange(6)
    if style == 0:
        name = "_".join(words).upper()  # DB_PASSWORD
    elif style == 1:
        name = "_".join(words)  # aws_session_token
    elif style == 2:
        name = words[0] + "".join(w.title() for w in words[1:])  # dbPassword
    elif style == 3:
        name = "".join(w.title() for w in words)  # DbPassword
    elif style == 4:
        name = "-".join(words)  # db-password
    else:
        name = "_".join(words)
    if r.random() < 0.2:
        name += one(r, "1", "2", "_2", "_prod", "_old")
    return name


def _assignment(r: Rng) -> Case:
    name, value = secret_name(r), rand_value(r)
    form = r.randrange(18)
    text = [
        f"{name}={value}",
        f"export {name}={value}",
        f'export {name}="{value}"',
        f"{name} = '{value}'",
        f'{name}: "{value}"',
        f"{name}: {value}",
        f"{name} := {value}",
        f"os.environ['{name}'] = '{value}'",
        f'os.environ["{name}"]="{value}"',
        f"{{'{name}': '{value}', 'user': 'bob'}}",
        f"config:\n  {name}: {value}\n  port: 5432",
        f"<{name}>{value}</{name}>",
        f"{name}:\n  {value}",  # the value on the next line
        f"{name} =\n{value}",
        f"{name}: |\n  {value}\nnext: 1",  # a YAML block scalar
        f'{name} = """{value}"""',
        f"{name}: `{value}`",
        f"{name}={value}; echo ok",
    ][form]
    return Case("assignment", text, (value,))


def _cli_flag(r: Rng) -> Case:
    value = rand_value(r)
    flag = one(r, "--password", "--token", "--api-key", "--secret", "--client-secret")
    text = one(
        r,
        f"mysql -u root {flag} {value} -h db",
        f"tool login {flag}={value}",
        f"app {flag} '{value}'",
        f"mysql -u root -p{value} -h db",
    )
    return Case("cli-flag", text, (value,))


def _curl_user(r: Rng) -> Case:
    value = rand_value(r)
    return Case("curl-user", f"curl {one(r, '-u', '--user')} {one(r, 'admin', 'me')}:{value} https://h.example.org", (value,))  # fmt: skip


def _phrase(r: Rng) -> Case:
    value = rand_value(r)
    head = one(r, "my password is", "the password was", "our passcode is", "API Key:", "api key is")
    return Case("password-phrase", f"{head} {value}", (value,))


JSON_KEYS = ["SecretAccessKey", "SessionToken", "ClientSecret", "Password", "ApiKey",
             "AccessToken", "RefreshToken", "clientSecret", "accessToken", "password",
             "api_key", "secret", "private_key"]  # fmt: skip


def _json(r: Rng) -> Case:
    pairs = {
        k: rand_value(r, 20, 40).replace("%", "x") for k in r.sample(JSON_KEYS, r.randint(1, 3))
    }
    doc = {"AccessKeyId": "id-" + str(r.randint(1, 99)), **pairs, "Expiration": "2030-01-01"}
    text = json.dumps(doc, indent=r.choice([None, 2]))
    return Case("json", text, tuple(pairs.values()))


def _json_escaped(r: Rng) -> Case:
    """JSON inside a JSON string (a tool summary of an API reply): `{\\"password\\": \\"...\\"}`."""
    key, value = one(r, *JSON_KEYS), rand_value(r, 20, 32)
    inner = json.dumps({key: value, "user": "bob"})
    text = one(
        r,
        json.dumps({"body": inner})[1:-1],  # the outer braces dropped: a fragment
        json.dumps({"body": inner}),
        json.dumps(json.dumps({"body": inner})),  # escaped twice: \\\"
    )
    return Case("json-escaped", text, (value,))


def _escaped_quote(r: Rng) -> Case:
    """A quoted value with an escaped quote inside: both halves must go."""
    key = one(r, "password", "secret", "token", "clientSecret", "DB_PASSWORD")
    first, second = rand(r, 16), rand(r, 16)
    text = one(
        r,
        f'"{key}": "{first}\\"{second}"',
        f'{key} = "{first}\\"{second}"',
        f"{key}: '{first}\\'{second}'",
    )
    return Case("escaped-quote", text, (first, second))


def _short_name(r: Rng) -> Case:
    """Short secret names (round 3): auth, pass, pw, passwd, REDIS_AUTH, session_key..."""
    name = one(r, "auth", "pass", "pw", "pwd", "passwd", "REDIS_AUTH", "ADMIN_PASS", "db.pw",
               "session_key", "consumer_key", "Auth", "PASS")  # fmt: skip
    value = rand_value(r)
    text = one(r, f"{name}={value}", f'"{name}": "{value}"', f"{name}: {value}",
               f"user=bob&{name}={value}", f"{name} := '{value}'")  # fmt: skip
    return Case("short-name", text, (value,))


def _aws_pair(r: Rng) -> Case:
    key_id = one(r, "AKIA", "ASIA") + rand(r, 16, UPPER + DIGITS)
    secret = rand(r, 40, ALNUM + "/+")
    sep = one(r, " / ", ":", ",", "\t", " ")
    return Case("aws-key-pair", one(r, "", "keys: ", "bob,x,") + key_id + sep + secret, (secret,))


def _redis_auth(r: Rng) -> Case:
    value = rand_value(r)
    text = one(r, f"requirepass {value}", f"AUTH {value}", f"AUTH default {value}",
               f"redis-cli -h cache -a {value} ping", f"masterauth {value}",
               f"machine h.example.org login bob password {value}")  # fmt: skip
    return Case("redis-auth", text, (value,))


def _login_password(r: Rng) -> Case:
    value = rand_value(r)
    text = one(r, f"docker login -u bob -p {value} registry.example.org",
               f"az login --service-principal -u http://app -p {value} --tenant t",
               f"CREATE USER 'bob'@'%' IDENTIFIED BY '{value}';",
               f'ALTER USER x IDENTIFIED WITH mysql_native_password BY "{value}";')  # fmt: skip
    return Case("login-password", text, (value,))


def _name_value(r: Rng) -> Case:
    name, value = secret_name(r), rand_value(r)
    text = one(r, f"- name: {name}\n  value: {value}", f'{{"name": "{name}", "value": "{value}"}}',
               f'<add key="{name}" value="{value}" />', f'<property name="{name}" value="{value}"/>',
               f'<entry key="{name}">{value}</entry>')  # fmt: skip
    return Case("secret-name-value", text, (value,))


ASSIGNMENT_FAMILIES: dict[str, Maker] = {
    "short-name": _short_name,
    "aws-key-pair": _aws_pair,
    "redis-auth": _redis_auth,
    "login-password": _login_password,
    "secret-name-value": _name_value,
    "assignment": _assignment,
    "cli-flag": _cli_flag,
    "curl-user": _curl_user,
    "password-phrase": _phrase,
    "json": _json,
    "json-escaped": _json_escaped,
    "escaped-quote": _escaped_quote,
}


def tool_named(r: Rng) -> tuple[str, Case]:
    """A tool named like a secret whose summary is the bare value: (tool, case)."""
    name = one(r, secret_name(r), "get_secret_access_key", "vault.read_password",
               "fetch:SessionToken", "aws.sts.SessionToken", "clientSecret")  # fmt: skip
    value = rand_value(r)
    return name, Case("tool-named", one(r, value, f"{value}\n", f" {value} "), (value,))


def tool_instance(seed: int, wrapper: str | None = None) -> tuple[str, Case]:
    r = random.Random(f"tool-named/{seed}/{wrapper}")
    name, case = tool_named(r)
    return name, (WRAPPERS[wrapper](case, r) if wrapper else case)


# -- grid session secrets ----------------------------------------------------------------------


def _session(r: Rng) -> Case:
    secret = rand_uuid(r)
    shown = secret.replace("-", "") if r.random() < 0.2 else secret
    if r.random() < 0.15:
        shown = "{" + shown + "}"
    name = one(r, "secure_session_id", "session_id")
    camel = one(r, "SecureSessionID", "SecureSessionId", "SessionID", "sessionId")
    agent = rand_uuid(r)
    text = one(
        r,
        f"{camel}: {shown}",
        f"{camel}={shown}",
        f"{name} => {shown}",
        f"{name} {shown}",
        f"{name}:\n{shown}",
        f"<member><name>{name}</name><value><string>{shown}</string></value></member>",
        f"<member><name>agent_id</name><value><string>{agent}</string></value></member>"
        f"<member><name>{name}</name>\n<value><string>{shown}</string></value></member>",
        f"<map><key>{name}</key><uuid>{shown}</uuid></map>",
        f"<key>{name}</key>\n  <uuid>{shown}</uuid>",
        f"{{'agent_id':u{agent},'{name}':u{shown}}}",
        f"{{'{name}':u{shown}}}",
    )
    return Case("grid-session", text, (shown.strip("{}"),))


def _azure(r: Rng) -> Case:
    key = b64(r, r.choice([64, 32]))
    text = one(
        r,
        f"DefaultEndpointsProtocol=https;AccountName={rand(r, 10, LOWER)};AccountKey={key};"
        "EndpointSuffix=core.windows.net",
        f"Endpoint=sb://{rand(r, 8, LOWER)}.servicebus.windows.net/;"
        f"SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}",
        f"HostName=hub.azure-devices.net;DeviceId=prim7;SharedAccessKey={key}",
    )
    return Case("azure", text, (key.rstrip("="),))


def _lsl(r: Rng) -> Case:
    value = rand(r, r.randint(24, 48))
    header = one(r, "X-Api-Key", "x-api-key", "Authorization", "X-Auth-Token")
    shown = f"Bearer {value}" if header == "Authorization" else value
    var = one(r, "OPENAI_KEY", "API_KEY", "apiKey", "gToken", "BOT_TOKEN", "webhookSecret",
              "SECRET", "gApiKey")  # fmt: skip
    text = one(
        r,
        f'llHTTPRequest(url, [HTTP_METHOD, "POST", HTTP_CUSTOM_HEADER, "{header}", "{shown}"], body);',
        f'list headers = [HTTP_CUSTOM_HEADER, "{header}", "{shown}"];',
        f'string {var} = "{value}";\ndefault {{ state_entry() {{ llOwnerSay("ready"); }} }}',
        f'string {var}="{value}";',
    )
    return Case("lsl", text, (value,))


GRID_FAMILIES: dict[str, Maker] = {
    "grid-session": _session,
    "azure": _azure,
    "lsl": _lsl,
}


FAMILIES: dict[str, Maker] = {
    **TOKEN_FAMILIES,
    **BLOCK_FAMILIES,
    **URL_FAMILIES,
    **HEADER_FAMILIES,
    **ASSIGNMENT_FAMILIES,
    **GRID_FAMILIES,
}
for _name, _make in list(FAMILIES.items()):
    # every maker names its own family: the tests report by it
    assert _make(random.Random(0)).family == _name, _name


# -- obfuscation wrappers --------------------------------------------------------------------

INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"]
SPACES = ["\u00a0", "\u2002", "\u2003", "\u2007", "\u2009", "\u200a", "\u202f", "\u3000"]


def _in_secrets(case: Case, change: Callable[[str], str]) -> Case:
    text = case.text
    for secret in case.secrets:
        text = text.replace(secret, change(secret))
    return replace(case, text=text)


def zero_width(case: Case, r: Rng) -> Case:
    """Invisible characters inside each secret (never at its ends)."""

    def change(secret: str) -> str:
        chars = list(secret)
        for _ in range(r.randint(1, 3)):
            chars.insert(r.randint(1, len(chars) - 1), r.choice(INVISIBLE))
        return "".join(chars)

    return _in_secrets(case, change)


def full_width(case: Case, r: Rng) -> Case:
    """Full-width look-alikes for some (or all) of each secret's characters."""
    share = r.choice([0.3, 1.0])

    def change(secret: str) -> str:
        return "".join(
            chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and r.random() < share else c for c in secret
        )

    return _in_secrets(case, change)


def unicode_spaces(case: Case, r: Rng) -> Case:
    """Unicode spaces (NBSP, en/em/thin/ideographic space) for the paste's ASCII spaces."""
    return replace(case, text="".join(r.choice(SPACES) if c == " " else c for c in case.text))


def invisible_and_spaces(case: Case, r: Rng) -> Case:
    return unicode_spaces(zero_width(case, r), r)


WRAPPERS: dict[str, Callable[[Case, Rng], Case]] = {
    "zero-width": zero_width,
    "full-width": full_width,
    "unicode-spaces": unicode_spaces,
    "zero-width+spaces": invisible_and_spaces,
}


# -- benign text -------------------------------------------------------------------------------

REGIONS = ["Ahern", "Sandbox One", "Bay City", "Morris", "Isle of Wyrms"]
EMOJI_ZWJ = ["👨‍👩‍👧", "🏳️‍🌈", "👩🏽‍💻", "🧑‍🚀", "❤️‍🔥", "👁️‍🗨️", "🐻‍❄️", "👨‍❤️‍💋‍👨"]
CHAT_WORDS = ["hi", "where", "is", "the", "sandbox", "boat", "party", "tonight", "lol",
              "thanks", "see", "you", "at", "noon", "nice", "hair", "dance", "?", "!"]  # fmt: skip


def _coords(r: Rng) -> str:
    return f"{r.randint(0, 255)}/{r.randint(0, 255)}/{r.randint(0, 4000)}"


def _emoji_chat(r: Rng) -> str:
    parts = [r.choice(CHAT_WORDS + EMOJI_ZWJ) for _ in range(r.randint(3, 12))]
    return " ".join(parts)


def _slurl(r: Rng) -> str:
    region = r.choice(REGIONS)
    return one(
        r,
        f"come to http://maps.secondlife.com/secondlife/{region.replace(' ', '%20')}/{_coords(r)}",
        f"secondlife://{region.replace(' ', '%20')}/{_coords(r)}",
        f"secondlife:///app/agent/{rand_uuid(r)}/about",
        f"secondlife:///app/teleport/{region.replace(' ', '%20')}/{_coords(r)}",
    )


def _hop(r: Rng) -> str:
    return f"hop://grid.example.org:8002/{r.choice(REGIONS).replace(' ', '%20')}/{_coords(r)}"


def _lsl_benign(r: Rng) -> str:
    return one(
        r,
        "key owner_key = llGetOwner();",
        "key target_key = NULL_KEY;",
        "integer pass = TRUE;",
        'llSetText("Pass: " + (string)n, <1,1,1>, 1.0);',
        f'llRegionSayTo(llGetOwner(), 0, "hello"); llSetPos(<{r.randint(0, 255)}, 128, 25>);',
        'default { touch_start(integer n) { llSay(0, "Touched."); } }',
        f'key texture = "{rand_uuid(r)}";',
    )


def _bare_uuid(r: Rng) -> str:
    return one(r, "my key is {}, add me", "texture {} on the prim", "{}", "object {} rezzed",
               "uuid: {}").format(rand_uuid(r))  # fmt: skip


def _everyday(r: Rng) -> str:
    return one(
        r,
        "Secret: Santa",
        "Secret: Santa, gifts by Friday!",
        "season pass: 2024",
        "cookie: chocolate chip",
        "my password is too weak lol",
        "the token of appreciation",
        "task-force meeting: keys, tokens and passwords are not for chat",
        "the sandbox resets at noon, ask the skeleton crew at sk-8 park",
        f"asset hash {rand(r, 40, HEX)}",
    )


def _code(r: Rng) -> str:
    return one(
        r,
        "sort_key = lambda x: x[1]",
        "password = getpass()",
        'password = os.environ["DB_PASSWORD"]',
        'token = request.headers.get("X-Token")',
        "items.sort(key=sort_key)",
    )


def _scripts(r: Rng) -> str:
    return one(
        r,
        "今晚在沙盒见面吧，我带音乐。",  # noqa: RUF001 (a CJK comma is CJK text)
        "東京の地域で会いましょう 🎉",
        "مرحبا بكم في الجزيرة، الحفلة الليلة",
        "Привет! Где песочница?",
        "Rendez-vous à midi\u00a0: «\u00a0la plage\u00a0» !",
        "안녕하세요 여러분",
    )


def _marker(r: Rng) -> str:
    return one(
        r,
        "[REDACTED:openai-key] was already removed",
        "password=[REDACTED:secret-assignment] ok",
        "see [REDACTED:x] and [REDACTED:grid-seed-cap]",
    )


BENIGN: dict[str, Callable[[Rng], str]] = {
    "emoji-zwj-chat": _emoji_chat,
    "slurl": _slurl,
    "hop": _hop,
    "lsl": _lsl_benign,
    "bare-uuid": _bare_uuid,
    "everyday": _everyday,
    "code": _code,
    "scripts": _scripts,
    "marker": _marker,
}


# -- checks and strategies ----------------------------------------------------------------------


def fold(text: str) -> str:
    """The text as a reader sees it: format characters (Cf, soft hyphen included) dropped,
    NFKC folded (full-width to ASCII), every Unicode space a plain space."""
    visible = "".join(c for c in text if unicodedata.category(c) != "Cf")
    folded = unicodedata.normalize("NFKC", visible)
    return "".join(" " if c.isspace() and c not in "\r\n" else c for c in folded)


def _runs(text: str) -> set[str]:
    return {text[i : i + WINDOW] for i in range(len(text) - WINDOW + 1)}


# A shorter piece of a secret is only counted right next to a redaction marker: what a
# span mapped back from the normalized view one character short would leave.
EDGE = 3
_MARKER = re.compile(r"\[REDACTED:[^\]\s]*\]")


Owners = list[tuple[str, str]]  # (family, secret)


class _Pieces:
    """Every piece of every secret of some cases, indexed for one pass over a text."""

    def __init__(self, cases: list[Case]) -> None:
        self.runs: dict[str, Owners] = {}
        self.heads: dict[str, Owners] = {}
        self.tails: dict[str, Owners] = {}
        for case in cases:
            for secret in case.secrets:
                owner = (case.family, secret)
                for i in range(len(secret) - WINDOW + 1):
                    self.runs.setdefault(secret[i : i + WINDOW], []).append(owner)
                for n in range(EDGE, WINDOW):
                    self.heads.setdefault(secret[:n], []).append(owner)
                    self.tails.setdefault(secret[-n:], []).append(owner)
        self.found: dict[str, dict[str, list[str]]] = {}

    def hit(self, piece: str, owners: Owners) -> None:
        for family, secret in owners:
            pieces = self.found.setdefault(family, {}).setdefault(secret, [])
            if piece not in pieces:
                pieces.append(piece)

    def scan(self, haystack: str, ignored: set[str]) -> None:
        for i in range(len(haystack) - WINDOW + 1):
            run = haystack[i : i + WINDOW]
            if run in self.runs and run not in ignored:
                self.hit(run, self.runs[run])
        for marker in _MARKER.finditer(haystack):
            after = haystack[marker.end() : marker.end() + WINDOW - 1]
            before = haystack[max(0, marker.start() - WINDOW + 1) : marker.start()]
            for n in range(EDGE, WINDOW):
                if len(after) >= n and after[:n] in self.tails:
                    self.hit(marker.group() + after[:n], self.tails[after[:n]])
                if len(before) >= n and before[-n:] in self.heads:
                    self.hit(before[-n:] + marker.group(), self.heads[before[-n:]])


def leaks_all(cases: list[Case], text: str, baseline: str = "") -> dict[str, dict[str, list[str]]]:
    """Per family, every secret of `cases` with pieces left in `text`, as stored or folded
    (`fold`): any run of WINDOW of its characters (unless also in `baseline`), or its
    first or last EDGE to WINDOW - 1 characters against a `[REDACTED:...]` marker.

    One pass over the text for all cases: the wire of a whole corpus is megabytes.
    """
    pieces = _Pieces(cases)
    ignored = (_runs(baseline) | _runs(fold(baseline))) if baseline else set()
    for haystack in (text, fold(text)):
        pieces.scan(haystack, ignored)
    return pieces.found


def leaks(case: Case, text: str, baseline: str = "") -> dict[str, list[str]]:
    """Every secret of `case` with runs left in `text` (see `leaks_all`)."""
    return leaks_all([case], text, baseline).get(case.family, {})


def instance(family: str, seed: int, wrapper: str | None = None) -> Case:
    """A deterministic instance: the same family, seed and wrapper give the same case."""
    r = random.Random(f"{family}/{seed}/{wrapper}")
    case = FAMILIES[family](r)
    return WRAPPERS[wrapper](case, r) if wrapper else case


def benign(kind: str, seed: int) -> str:
    return BENIGN[kind](random.Random(f"{kind}/{seed}"))


SEEDS = st.integers(0, 2**64 - 1)


def cases(family: str, wrapped: bool = False) -> st.SearchStrategy[Case]:
    """Fresh instances of one family; `wrapped`: each under a random obfuscation."""
    if not wrapped:
        return SEEDS.map(lambda seed: instance(family, seed))
    return st.tuples(SEEDS, st.sampled_from(sorted(WRAPPERS))).map(
        lambda p: instance(family, p[0], p[1])
    )


ANY_CASE: st.SearchStrategy[Case] = st.tuples(
    st.sampled_from(sorted(FAMILIES)), SEEDS, st.sampled_from([None, *sorted(WRAPPERS)])
).map(lambda p: instance(*p))
ANY_BENIGN: st.SearchStrategy[str] = st.tuples(st.sampled_from(sorted(BENIGN)), SEEDS).map(
    lambda p: benign(*p)
)

GLUE = ["{}", "({})", "`{}`", '"{}"', "```\n{}\n```", "> {}", "{}."]


@st.composite
def chat(draw: st.DrawFn, min_cases: int = 1, max_cases: int = 4) -> tuple[str, list[Case]]:
    """Ordinary chat with instances of random families (some obfuscated) pasted in."""
    found = draw(st.lists(ANY_CASE, min_size=min_cases, max_size=max_cases))
    parts = draw(st.lists(ANY_BENIGN | st.sampled_from(CHAT_WORDS), max_size=6))
    for case in found:
        glue = draw(st.sampled_from(GLUE))
        parts.insert(draw(st.integers(0, len(parts))), glue.format(case.text))
    sep = draw(st.sampled_from([" ", "\n", " , ", "\n\n", "\t"]))
    return sep.join(parts), found
