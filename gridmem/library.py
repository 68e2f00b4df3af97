"""The function library: lua/ read once, a prelude generated from Python, one FUNCTION LOAD.

Every script runs as a function of one Redis function library (`FunctionLibrary`:
the prelude, lib.lua, then each script wrapped as a function); the store does
FUNCTION LOAD on "Function not found" and retries once. A library is named after
a hash of its code, so workers of different versions sharing one server each call
their own functions. Compared with EVALSHA of a script with lib.lua prepended,
the helpers are defined once per load instead of on every call: about 7 us less
server time per call (docs/benchmarks.md). Each script also stays a standalone
source (prelude + lib.lua + script) for EVAL, which the Lua tests use.

The prelude is the one place the Lua side gets a value Python also uses: TTLs,
session key parts, the shard scripts' KEYS layout, the limits packet's field
order, the clock table's bounds, the UUID and session ID patterns, the record
kinds' codes and summary heads, and the event and dead-letter reason codes, each
written from the Python constant (`prelude()`). lib.lua defines none of them.
bin/gridmem-cli, a bash script that may run where gridmem is not importable,
reads the same prelude from lua/generated/prelude.lua, which `python -m gridmem.library` writes and
tests/test_lua_scripts.py checks is `prelude()`, byte for byte.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gridmem.clock import MAX_BOOT_ID_CHARS
from gridmem.clock import MAX_CLOCK_BOOTS
from gridmem.config import LIMIT_FIELDS
from gridmem.ids import SESSION_ID_LUA
from gridmem.ids import UUID_LUA
from gridmem.keys import SESSION_PARTS
from gridmem.keys import SHARD_PARTS
from gridmem.kinds import KINDS
from gridmem.records import CHANNEL_TTL_MS
from gridmem.records import DeadLetterReason
from gridmem.records import ReasonCode

SCRIPT_NAMES: tuple[str, ...] = (
    "record_turn",
    "read_page",
    "read_context",
    "list_metadata",
    "sweep_idle",
    "delete_session",
    "pop_newest",
    "export_sessions",
    "restore_session",
    "publish_event",
    "read_receipt",
    "publish_layout",
    "take_inbound",
    "claim_key",
    "begin_attempt",
    "finish_entry",
    "publish_and_finish",
    "renew_lease",
    "orphaned_keys",
    "read_backlog",
)

# Where bin/gridmem-cli finds the prelude, under lua/ (written by `python -m gridmem.library`).
PRELUDE_FILE = "generated/prelude.lua"

_KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)\]", re.MULTILINE)
_FLAGS_LINE = re.compile(r"^-- Flags:\s+(\S+)", re.MULTILINE)
# The script flags a gridmem function may declare; "none" declares none.
_KNOWN_FLAGS = {"no-writes", "allow-oom", "none"}


def lua_dir() -> Path:
    """Where the .lua files are: inside the installed package, else the source tree."""
    packaged = Path(str(resources.files("gridmem"))) / "lua"
    if (packaged / "lib.lua").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


def _lua(value: object) -> str:
    """A Python constant as a Lua literal: int, bool, str, tuple (a list) or dict (a table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if not re.fullmatch(r"[ -&(-\[\]-~]*", value):  # printable ASCII, no ' or \
            raise ValueError(f"not a plain Lua string: {value!r}")
        return f"'{value}'"
    if isinstance(value, tuple):
        return "{ " + ", ".join(_lua(v) for v in value) + " }"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_lua(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


def prelude() -> str:
    """The Lua constants every script shares, written from the Python ones."""
    kinds = {k.name: k.code for k in KINDS}
    heads = {k.code: k.head for k in KINDS}
    reasons = {code.value: code.value for code in ReasonCode}
    dead = {code.value: code.value for code in DeadLetterReason}
    constants: list[tuple[str, str, object]] = [
        ("TTL_MS", "inactivity TTLs, exact (gridmem/records.py)", dict(CHANNEL_TTL_MS)),
        ("SESSION_PARTS", "parts of a session, in order (gridmem/keys.py)", SESSION_PARTS),
        ("SHARD_PARTS", "a shard script's shard KEYS, in order (gridmem/keys.py)", SHARD_PARTS),
        ("LIMIT_FIELDS", "record_turn's limits packet, in order (gridmem/config.py)", LIMIT_FIELDS),
        ("MAX_BOOT_ID_CHARS", "longest boot id (gridmem/clock.py)", MAX_BOOT_ID_CHARS),
        ("MAX_CLOCK_BOOTS", "boots a clock hash keeps (gridmem/clock.py)", MAX_CLOCK_BOOTS),
        ("UUID_BODY", "a canonical UUID, unanchored (gridmem/ids.py)", UUID_LUA),
        ("SESSION_ID_BODY", "a session ID, unanchored (gridmem/ids.py)", SESSION_ID_LUA),
        ("KIND_CODE", "record kind -> payload code (gridmem/kinds.py)", kinds),
        ("KIND_HEAD", "payload code -> summary head parts (gridmem/kinds.py)", heads),
        ("REASON", "event reason codes (gridmem/records.py ReasonCode)", reasons),
        ("DEAD", "dead-letter reason codes (gridmem/records.py DeadLetterReason)", dead),
    ]
    lines = [
        "-- prelude: generated by gridmem/library.py from the Python constants; do not edit.",
        "-- KEYS/ARGV: none (it defines constants only). Returns: nothing. Errors: none.",
    ]
    for name, what, value in constants:
        lines += [f"-- {what}", f"local {name} = {_lua(value)}"]
    return "\n".join(lines) + "\n"


def lib_source() -> str:
    """The prelude and lib.lua: what every script's code starts with."""
    return prelude() + (lua_dir() / "lib.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class FunctionLibrary:
    """Every script as a function of one library: FUNCTION LOAD once, then FCALL."""

    name: str  # gridmem_<hash of the code>: another version's library loads beside it
    code: str


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One script: its function in the library, and a standalone source for EVAL."""

    name: str
    source: str  # prelude + lib.lua + the script, for EVAL (the Lua tests)
    key_count: int  # from the contract header; the wrappers must pass exactly this many
    flags: tuple[str, ...]  # from the contract header's Flags line
    function: str  # its name in `library`, for FCALL
    library: FunctionLibrary


def load_scripts(directory: Path | None = None) -> dict[str, LuaScript]:
    """Read lib.lua and every script once, and build the function library."""
    directory = directory or lua_dir()
    lib = prelude() + (directory / "lib.lua").read_text(encoding="utf-8")
    bodies = {
        name: (directory / f"{name}.lua").read_text(encoding="utf-8") for name in SCRIPT_NAMES
    }
    flags = {name: _flags(name, body) for name, body in bodies.items()}
    functions = [_function_code(name, body) for name, body in bodies.items()]
    body_code = "\n".join([lib, *functions])
    tag = hashlib.sha1(body_code.encode("utf-8")).hexdigest()[:16]
    library_name = f"gridmem_{tag}"
    registrations = [
        f"redis.register_function{{function_name='{library_name}_{name}', "
        f"callback=script_{name}, flags={{{', '.join(repr(f) for f in flags[name])}}}}}"
        for name in SCRIPT_NAMES
    ]
    library = FunctionLibrary(
        library_name, "\n".join([f"#!lua name={library_name}", body_code, *registrations, ""])
    )
    scripts = {}
    for name, body in bodies.items():
        declared = [int(n) for n in _KEYS_LINE.findall(body)]
        scripts[name] = LuaScript(
            name,
            f"{lib}\n{body}",
            max(declared, default=0),
            flags[name],
            f"{library_name}_{name}",
            library,
        )
    return scripts


def _flags(name: str, body: str) -> tuple[str, ...]:
    """The Flags line of a script's header: each script states its flags on purpose."""
    found = _FLAGS_LINE.search(body)
    if found is None or found.group(1) not in _KNOWN_FLAGS:
        raise ValueError(f"lua/{name}.lua: its header needs '-- Flags: no-writes|allow-oom|none'")
    return () if found.group(1) == "none" else (found.group(1),)


def _function_code(name: str, body: str) -> str:
    """A script as a library function. Its parameters are named KEYS and ARGV, so the
    script's text is the same as for EVAL; its argument checks (lib.lua new_args) are
    a value of the call, so nothing is left over from one call to the next."""
    return f"local function script_{name}(KEYS, ARGV)\n{body}\nend"


def write_prelude(directory: Path | None = None) -> Path:
    """Write the prelude where bin/gridmem-cli reads it (lua/generated/prelude.lua)."""
    path = (directory or lua_dir()) / PRELUDE_FILE
    path.parent.mkdir(exist_ok=True)
    path.write_text(prelude(), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_prelude(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
