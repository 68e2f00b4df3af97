"""Every Redis key name gridmem uses, built in one place.

Layout (namespace "gm", shard 0):

    gm:{0}:s:<uuid>:<channel>:meta      hash    session metadata
    gm:{0}:s:<uuid>:<channel>:turns     zset    transcript, score = seq
    gm:{0}:s:<uuid>:<channel>:idem      hash    idempotency key -> first receipt
    gm:{0}:s:<uuid>:<channel>:summary   string  factual summary of folded turns
    gm:{0}:s:<uuid>:<channel>:archive   zset    archived turns (opt-in)
    gm:{0}:lru:<channel>                zset    member <uuid>:<channel>, score = last activity
    gm:{0}:sessions                     zset    every live session, score 0, ordered by member
    gm:{0}:seq                          string  sequence counter
    gm:{0}:clock                        hash    clock domain: latest time, an offset per boot id
    gm:{0}:events                       stream  events, exact MAXLEN
    gm:{0}:stats                        hash    bytes: the shard's stored bytes, kept exact
    gm:{0}:restored                     string  generation restored from (snapshots)
    gm:{0}:limits                       hash    what the shard runs with (for bin/gridmem-cli)

    gm:layout                           hash    namespace -> its shards' key prefixes: where
                                                bin/gridmem-cli finds the store (KeySpace.layout)

    gm:inbound / gm:outbound / gm:dead  stream  the worker service's stream contract
    {gm:inbound}:ready                  set     conversation keys with inbound entries waiting
    {gm:inbound}:mbox:<uuid>:<ch>       list    waiting entry IDs of one key, arrival order
    {gm:inbound}:owner:<uuid>:<ch>      string  the worker answering that key (a lease)
    {gm:inbound}:attempts               hash    entry ID -> attempts at answering it (poison)
    {gm:inbound}:rejected               hash    entry ID -> dead-letter reason decided for it

    With `partitions` P > 1 (gridmem/partitions.py), partition p's service keys are
    gm:{<tag p>}:inbound, :outbound, :dead, :ready, :mbox:<uuid>:<ch>, :owner:<uuid>:<ch>,
    :attempts, :rejected: all of one partition in one cluster slot.

The `{0}` is the shard's hash tag (`shard_tags`): it puts a session's keys and
its shard's indexes in one Redis Cluster slot, so every script touches one slot,
and with N shards the N tags' slots spread evenly over the 16,384 (one shard's
tag is `0`, as above; with 16 shards `0-4`, `1-3`, `2-43`, ...). Both
channels of an avatar live in the same shard. lua/lib.lua rebuilds a session's
key names from an index member for expiry/eviction victims, from SESSION_PARTS
(in the prelude).
"""

from __future__ import annotations

import binascii
import dataclasses
import functools
import itertools
import zlib
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from gridmem.partitions import partition_of
from gridmem.partitions import partition_tags
from gridmem.records import Channel

SESSION_PARTS: tuple[str, ...] = ("meta", "turns", "idem", "summary", "archive")
# The shard's keys every script that keeps a shard takes (record_turn, restore_session,
# sweep_idle, delete_session), in this order, after a session's SESSION_PARTS where it
# has one (session_calls.shard_script_keys builds them; lib.lua reads them by name).
SHARD_PARTS: tuple[str, ...] = (
    "lru_public",
    "lru_im",
    "sessions",
    "seq",
    "clock",
    "events",
    "stats",
)


@functools.cache
def shard_tags(shards: int) -> tuple[str, ...]:
    """The hash tag of each of `shards` shards, chosen so their slots spread evenly.

    Shard i of N owns the slot range [floor(i x 16384 / N), floor((i + 1) x 16384 / N));
    its tag is the first of `i`, `i-1`, `i-2`, ... whose Redis Cluster slot (CRC16
    XMODEM of the tag, mod 16384) lies in that range. So a cluster whose primaries
    own equal slot ranges owns equal numbers of shards (give or take one), and a
    one-shard store keeps the tag `0`. The rule is docs/scaling.md's; a tool in
    another language finds the same tags (or reads them from the published layout).
    """
    return tuple(_shard_tag(i, shards) for i in range(shards))


def _shard_tag(shard: int, shards: int) -> str:
    """Found in about 16384 / range-width tries: 1,024 shards take ~0.3 s, once a process."""
    low = shard * REDIS_CLUSTER_HASH_SLOTS // shards
    high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
    for n in itertools.count():
        tag = f"{shard}-{n}" if n else str(shard)
        # a tag holds no brace, so its slot is the CRC of the whole (redis.crc.key_slot)
        if low <= binascii.crc_hqx(tag.encode("ascii"), 0) % REDIS_CLUSTER_HASH_SLOTS < high:
            return tag
    raise AssertionError("unreachable: itertools.count() never ends")


def session_member(avatar_uuid: str, channel: Channel) -> str:
    """The index member naming one session: `<uuid>:<channel>` (sorts by UUID, then channel)."""
    return _member(avatar_uuid, channel.value)


def _member(avatar_uuid: str, channel: str) -> str:
    return f"{avatar_uuid}:{channel}"


# The placeholders of the published key templates (KeySpace.templates): bin/gridmem-cli
# puts an avatar's UUID and a channel in their place, and builds no key name itself.
UUID_SLOT, CHANNEL_SLOT = "<uuid>", "<channel>"
# Published template fields are named `key_<name>`: the shard's keys (ShardKeys' fields),
# a session's keys (SESSION_PARTS) and the index member naming a session.
TEMPLATE_FIELD = "key_"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    member: str
    meta: str
    turns: str
    idem: str
    summary: str
    archive: str

    def all(self) -> tuple[str, ...]:
        return (self.meta, self.turns, self.idem, self.summary, self.archive)


@dataclass(frozen=True, slots=True)
class ShardKeys:
    shard: int
    lru_public: str
    lru_im: str
    sessions: str
    seq: str
    clock: str
    events: str
    stats: str
    restored: str
    limits: str

    def lru(self, channel: Channel) -> str:
        return self.lru_public if channel is Channel.PUBLIC else self.lru_im


# The stream contract (docs/streams.md): the fields an entry of each service stream may
# have. The service refuses other inbound fields; the backlog file holds no others.
INBOUND_FIELDS = frozenset({"avatar_uuid", "channel", "text", "avatar_name"})
OUTBOUND_FIELDS = frozenset({"avatar_uuid", "channel", "text", "in_reply_to", "session_id"})


@dataclass(frozen=True, slots=True)
class ServiceKeys:
    """Stream contract (DESIGN section 11) plus the per-key mailboxes' index, of one
    partition (docs/streams.md): every key of it in one cluster slot.

    Mailboxes `{gm:inbound}:mbox:<uuid>:<ch>` and owner leases
    `{gm:inbound}:owner:<uuid>:<ch>` are named in Lua (lib.lua mailbox_keys), from
    the ready set's prefix (hash tag included).
    """

    inbound: str
    outbound: str
    dead: str
    ready: str
    attempts: str
    rejected: str
    partition: int = 0


def service_streams(namespace: str = "gm", partitions: int = 1) -> tuple[ServiceKeys, ...]:
    """The worker service's keys, one ServiceKeys per partition (docs/streams.md): what a
    bridge writes to (`.inbound` of its avatar's partition, gridmem.partition_of) and
    reads from (every partition's `.outbound`)."""
    return KeySpace(namespace, 1, partitions).services()


class KeySpace:
    """Key names for one namespace and shard count."""

    def __init__(self, namespace: str = "gm", shards: int = 1, partitions: int = 1) -> None:
        self.namespace = namespace
        self.shards = shards
        self.partitions = partitions
        self._service_keys = tuple(self._build_service(p) for p in range(partitions))
        self.tags = shard_tags(shards)
        self._shard_keys = tuple(self._build_shard(n) for n in range(shards))
        # every call names a session's keys; the same residents talk again and again
        self.session = functools.lru_cache(maxsize=4096)(self._session)  # type: ignore[method-assign]

    @property
    def layout(self) -> str:
        """Where the store says where its shards live (publish_layout); bin/gridmem-cli
        starts here. Inside the namespace, as every key is, so an ACL of `~gm:*` covers it."""
        return f"{self.namespace}:layout"

    def prefix(self, shard: int) -> str:
        return f"{self.namespace}:{{{self.tags[shard]}}}:"

    def shard_of(self, avatar_uuid: str) -> int:
        if self.shards == 1:
            return 0
        return zlib.crc32(avatar_uuid.encode("ascii")) % self.shards

    def shard(self, shard: int) -> ShardKeys:
        return self._shard_keys[shard]

    def all_shards(self) -> tuple[ShardKeys, ...]:
        return self._shard_keys

    def session(self, avatar_uuid: str, channel: Channel) -> tuple[SessionKeys, ShardKeys]:
        """A session's keys and its shard's keys (same hash tag). Cached per instance."""
        return self._session(avatar_uuid, channel)

    def _session(self, avatar_uuid: str, channel: Channel) -> tuple[SessionKeys, ShardKeys]:
        shard = self.shard_of(avatar_uuid)
        return self._session_keys(shard, session_member(avatar_uuid, channel)), self._shard_keys[
            shard
        ]

    def _session_keys(self, shard: int, member: str) -> SessionKeys:
        base = f"{self.prefix(shard)}s:{member}:"
        return SessionKeys(member, *(base + part for part in SESSION_PARTS))

    def templates(self, shard: int) -> dict[str, str]:
        """Every key name of one shard, as `key_<name>` -> template, for bin/gridmem-cli.

        Built by the same code as the keys themselves; a session's templates hold
        UUID_SLOT and CHANNEL_SLOT where its avatar's UUID and channel go.
        """
        session = self._session_keys(shard, _member(UUID_SLOT, CHANNEL_SLOT))
        names = {
            f.name: getattr(self._shard_keys[shard], f.name)
            for f in dataclasses.fields(ShardKeys)
            if f.name != "shard"
        }
        names |= {f.name: getattr(session, f.name) for f in dataclasses.fields(SessionKeys)}
        return {TEMPLATE_FIELD + name: value for name, value in names.items()}

    def service(self, partition: int = 0) -> ServiceKeys:
        """One partition's streams and bookkeeping (outside the session shards)."""
        return self._service_keys[partition]

    def services(self) -> tuple[ServiceKeys, ...]:
        """Every partition's, in partition order."""
        return self._service_keys

    def service_of(self, avatar_uuid: str) -> ServiceKeys:
        """The keys of the partition an avatar's messages go to (partition_of)."""
        return self._service_keys[partition_of(avatar_uuid, self.partitions)]

    def _build_service(self, partition: int) -> ServiceKeys:
        if self.partitions == 1:
            # the names every bridge has used from the start; the bookkeeping keys in the
            # inbound stream's cluster slot: `{gm:inbound}` hashes like `gm:inbound`
            streams = f"{self.namespace}:"
            bookkeeping = f"{{{streams}inbound}}:"
        else:
            streams = bookkeeping = (
                f"{self.namespace}:{{{partition_tags(self.partitions)[partition]}}}:"
            )
        return ServiceKeys(
            **{name: streams + name for name in ("inbound", "outbound", "dead")},
            **{name: bookkeeping + name for name in ("ready", "attempts", "rejected")},
            partition=partition,
        )

    def _build_shard(self, shard: int) -> ShardKeys:
        p = self.prefix(shard)
        return ShardKeys(
            shard=shard,
            lru_public=p + "lru:public",
            lru_im=p + "lru:im",
            sessions=p + "sessions",
            seq=p + "seq",
            clock=p + "clock",
            events=p + "events",
            stats=p + "stats",
            restored=p + "restored",
            limits=p + "limits",
        )
