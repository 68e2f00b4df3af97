"""One typed method per operation on Redis: the session calls and the stream calls.

What lives where: gridmem/library.py builds the function library (lua/, the
generated prelude, `FunctionLibrary`); gridmem/replies.py holds the call and reply
types and their parsers; gridmem/session_calls.py the session calls (and the
limits packet); gridmem/stream_calls.py the worker service's stream calls. A call
is a Lua script's (`ScriptCall`) where a change must be atomic across keys, else
plain commands (`CommandCall`, `ReadCall`). `Scripts` is both sets of calls;
`ConversationStore`, `AsyncConversationStore` and the service run the same calls,
so the doors cannot drift apart. The names below are re-exported for the modules
that import them here.
"""

from __future__ import annotations

from gridmem.config import LIMIT_FIELDS, LOW_WATER, MAX_EVICTIONS_PER_CALL, WRITE_SWEEP_BATCH
from gridmem.library import SCRIPT_NAMES, FunctionLibrary, LuaScript, load_scripts, lua_dir
from gridmem.replies import (
    REJECTED_MEMBER,
    Arg,
    AttemptCount,
    ClockReading,
    CommandCall,
    ExportedSession,
    ExportReply,
    KeyStep,
    MetadataReply,
    MetaRow,
    PageReply,
    ReadCall,
    RecordReply,
    ScriptCall,
    StatsReply,
    TakenEntry,
    text,
    texts,
)
from gridmem.session_calls import SessionCalls, limits_packet
from gridmem.stream_calls import StreamCalls

__all__ = [
    "LIMIT_FIELDS",
    "LOW_WATER",
    "MAX_EVICTIONS_PER_CALL",
    "REJECTED_MEMBER",
    "SCRIPT_NAMES",
    "WRITE_SWEEP_BATCH",
    "Arg",
    "AttemptCount",
    "ClockReading",
    "CommandCall",
    "ExportReply",
    "ExportedSession",
    "FunctionLibrary",
    "KeyStep",
    "LuaScript",
    "MetaRow",
    "MetadataReply",
    "PageReply",
    "ReadCall",
    "RecordReply",
    "ScriptCall",
    "Scripts",
    "StatsReply",
    "TakenEntry",
    "limits_packet",
    "load_scripts",
    "lua_dir",
    "text",
    "texts",
]


class Scripts(SessionCalls, StreamCalls):
    """One typed method per operation (a script's or plain commands' call). Holds the
    scripts' sources; never a connection."""
