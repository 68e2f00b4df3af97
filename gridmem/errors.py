"""Every error gridmem raises on purpose, and the one table that maps Lua codes to them.

All of them derive from `GridmemError`, itself a `ValueError`, so a caller can
catch "gridmem refused this" in one place. Input errors always name the field
that was wrong and are raised before any Redis command is sent.
"""

from __future__ import annotations


class GridmemError(ValueError):
    """Base class: gridmem refused or could not complete a request."""


class InvalidInput(GridmemError):
    """A caller-supplied value is malformed; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidAvatarId(InvalidInput):
    """Not a UUID in 8-4-4-4-12 hex form."""


class InvalidChannel(InvalidInput):
    """Not one of the two channels ("public", "im")."""


class InvalidRecord(InvalidInput):
    """A record payload of an unknown kind, with an unknown field, or a bad value."""


class InputTooLarge(InvalidInput):
    """Text over the hard input ceiling: rejected whole, nothing stored."""


class CorruptRecord(GridmemError):
    """Stored data that cannot be decoded. It is never passed on as model input."""


class StoreClosed(GridmemError):
    """The store was closed (like a closed file, a ValueError): build another one.

    A closed store from from_config no longer counts as a user of the private server,
    which may stop under it once the others leave; its calls used to go on quietly
    until then, and then fail as a connection error."""

    def __init__(self) -> None:
        super().__init__("this store is closed (close() or the end of its with block)")


class RecordedWithoutContext(RuntimeError):
    """record_and_context stored the record (`receipt`), then the context could not be
    made from what it read: the token counter raised or counted wrong. Not a
    ValueError on purpose: the record is stored, and sending it again without an
    idempotency key would store it twice. The cause is chained (`__cause__`)."""

    def __init__(self, receipt: object) -> None:
        super().__init__(
            "the record was stored; its context could not be made (the token counter "
            "failed: see the cause); read it again with context()"
        )
        self.receipt = receipt


class DurabilityTimeout(GridmemError):
    """`durability = "replica"`: no replica confirmed a state change within the WAIT
    timeout. The change was made on the primary and may be lost at a failover; an
    idempotent call is retried (docs/scaling.md, Durability)."""


class ConfigError(GridmemError):
    """A setting is invalid (for example above its hard ceiling)."""


class ScriptError(GridmemError):
    """A Lua script refused its arguments. This is a bug in the caller, never retried."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class BadScriptArgument(ScriptError):
    """GM_BADARG: a script argument failed validation inside Lua."""


class CorruptState(ScriptError):
    """GM_CORRUPT: the store holds data a script cannot interpret."""


class NoConsumerGroup(ScriptError):
    """GM_NOGROUP: the inbound stream's consumer group is gone (the server lost its data)."""


# Each Lua error code maps to exactly one exception class.
SCRIPT_ERRORS: dict[str, type[ScriptError]] = {
    "GM_BADARG": BadScriptArgument,
    "GM_CORRUPT": CorruptState,
    "GM_NOGROUP": NoConsumerGroup,
}


def script_error_from_reply(message: str) -> ScriptError | None:
    """Translate a Redis error reply raised by one of our scripts, or None if it is not ours."""
    code = message.split(" ", 1)[0]
    cls = SCRIPT_ERRORS.get(code)
    if cls is None:
        return None
    return cls(code, message)
