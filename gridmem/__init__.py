"""gridmem: bounded, isolated conversation memory for LLM agents in virtual worlds."""

from gridmem.clock import Clock
from gridmem.clock import ManualClock
from gridmem.clock import SystemClock
from gridmem.config import ConversationConfig
from gridmem.config import Limits
from gridmem.config import Settings
from gridmem.errors import ConfigError
from gridmem.errors import CorruptRecord
from gridmem.errors import GridmemError
from gridmem.errors import InputTooLarge
from gridmem.errors import InvalidAvatarId
from gridmem.errors import InvalidChannel
from gridmem.errors import InvalidInput
from gridmem.errors import InvalidRecord
from gridmem.errors import RecordedWithoutContext
from gridmem.errors import ScriptError
from gridmem.keys import ServiceKeys
from gridmem.keys import service_streams
from gridmem.partitions import partition_of
from gridmem.records import ActionResult
from gridmem.records import AgentReply
from gridmem.records import AvatarMessage
from gridmem.records import Channel
from gridmem.records import ContextMessage
from gridmem.records import Event
from gridmem.records import MetadataPage
from gridmem.records import ReasonCode
from gridmem.records import Receipt
from gridmem.records import SessionMetadata
from gridmem.records import ToolSummary
from gridmem.records import TurnPage
from gridmem.records import TurnView
from gridmem.snapshots import RestoreReport
from gridmem.snapshots import SnapshotError
from gridmem.snapshots import SnapshotInfo
from gridmem.store import AsyncConversationStore
from gridmem.store import ConversationStore
from gridmem.store import connect
from gridmem.store import connect_async
from gridmem.store import connect_cluster
from gridmem.store import connect_cluster_async

__version__ = "0.1.0"

__all__ = [
    "ActionResult",
    "AgentReply",
    "AsyncConversationStore",
    "AvatarMessage",
    "Channel",
    "Clock",
    "ConfigError",
    "ContextMessage",
    "ConversationConfig",
    "ConversationStore",
    "CorruptRecord",
    "Event",
    "GridmemError",
    "InputTooLarge",
    "InvalidAvatarId",
    "InvalidChannel",
    "InvalidInput",
    "InvalidRecord",
    "Limits",
    "ManualClock",
    "MetadataPage",
    "ReasonCode",
    "Receipt",
    "RecordedWithoutContext",
    "RestoreReport",
    "ScriptError",
    "ServiceKeys",
    "SessionMetadata",
    "Settings",
    "SnapshotError",
    "SnapshotInfo",
    "SystemClock",
    "ToolSummary",
    "TurnPage",
    "TurnView",
    "__version__",
    "connect",
    "connect_async",
    "connect_cluster",
    "connect_cluster_async",
    "partition_of",
    "service_streams",
]
