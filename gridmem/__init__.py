"""gridmem: bounded, isolated conversation memory for LLM agents in virtual worlds."""

from gridmem.clock import Clock, ManualClock, SystemClock
from gridmem.config import ConversationConfig, Limits, Settings
from gridmem.errors import (
    ConfigError,
    CorruptRecord,
    GridmemError,
    InputTooLarge,
    InvalidAvatarId,
    InvalidChannel,
    InvalidInput,
    InvalidRecord,
    ScriptError,
)
from gridmem.keys import ServiceKeys, service_streams
from gridmem.partitions import partition_of
from gridmem.records import (
    ActionResult,
    AgentReply,
    AvatarMessage,
    Channel,
    ContextMessage,
    Event,
    MetadataPage,
    ReasonCode,
    Receipt,
    SessionMetadata,
    ToolSummary,
    TurnPage,
    TurnView,
)
from gridmem.snapshots import RestoreReport, SnapshotError, SnapshotInfo
from gridmem.store import (
    AsyncConversationStore,
    ConversationStore,
    connect,
    connect_async,
    connect_cluster,
    connect_cluster_async,
)

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
