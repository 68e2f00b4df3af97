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

from gridmem.config import LIMIT_FIELDS
from gridmem.config import LOW_WATER
from gridmem.config import MAX_EVICTIONS_PER_CALL
from gridmem.config import WRITE_SWEEP_BATCH
from gridmem.library import SCRIPT_NAMES
from gridmem.library import FunctionLibrary
from gridmem.library import LuaScript
from gridmem.library import load_scripts
from gridmem.library import lua_dir
from gridmem.replies import REJECTED_MEMBER
from gridmem.replies import Arg
from gridmem.replies import AttemptCount
from gridmem.replies import ClockReading
from gridmem.replies import CommandCall
from gridmem.replies import ExportedSession
from gridmem.replies import ExportReply
from gridmem.replies import KeyStep
from gridmem.replies import MetadataReply
from gridmem.replies import MetaRow
from gridmem.replies import PageReply
from gridmem.replies import ReadCall
from gridmem.replies import RecordReply
from gridmem.replies import ScriptCall
from gridmem.replies import StatsReply
from gridmem.replies import TakenEntry
from gridmem.replies import text
from gridmem.replies import texts
from gridmem.session_calls import SessionCalls
from gridmem.session_calls import limits_packet
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
