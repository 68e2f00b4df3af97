"""`gridmem cluster-check`: is every slot of the cluster served, and by whom.

An operator's glance at a Valkey/Redis Cluster that holds a gridmem store: which
primaries serve the 16,384 hash slots (and their replicas), any slot served by
nobody (then the exit status is 1: part of the store cannot be read or written),
and each primary's share of the store's sessions. Sessions are counted from each
shard's session index (one ZCARD per shard, on the primary that owns the slot of
the shard's hash tag), so the share is what the shard tags and the slot map make
of the store, not a guess from key counts.

Everything comes from one node's view, CLUSTER NODES of the node at the URL: the
view a client starting there gets. Nodes disagree only for the moments a change
takes to spread (a failover, a reshard); run it again, or against another node.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import redis
from redis.crc import key_slot

from gridmem.config import redacted_url
from gridmem.errors import ConfigError
from gridmem.executor import Executor
from gridmem.keys import KeySpace

SLOTS = 16384


@dataclass(frozen=True)
class Node:
    """One line of CLUSTER NODES."""

    node_id: str
    address: str  # host:port, as the cluster announces it (clients connect there)
    flags: frozenset[str]
    primary_id: str | None  # the primary a replica follows; None for a primary
    slots: tuple[tuple[int, int], ...]  # inclusive ranges it serves (importing/migrating left out)

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        """Failed by the cluster's agreement (`fail`); `fail?` is one node's suspicion."""
        return "fail" in self.flags

    @property
    def state(self) -> str:
        if self.failed:
            return "FAIL"
        if "fail?" in self.flags:
            return "suspected (fail?)"
        return "ok"


def parse_nodes(text: str) -> list[Node]:
    """CLUSTER NODES' lines: `<id> <ip:port@cport[,hostname]> <flags> <primary|-> <ping>
    <pong> <epoch> <link> <slot>...`; a slot is `N`, `A-B`, or `[N->-id]`/`[N-<-id]` while
    it migrates (still served by the node that lists it plainly)."""
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        node_id, address, flags, primary = fields[:4]
        if {"noaddr", "handshake"} & set(flags.split(",")):
            continue  # being met or forgotten: no address, no slots
        host_port = address.split("@", 1)[0]
        slots = []
        for entry in fields[8:]:
            if entry.startswith("["):
                continue
            first, _, last = entry.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append(
            Node(
                node_id=node_id,
                address=host_port,
                flags=frozenset(flags.split(",")),
                primary_id=None if primary == "-" else primary,
                slots=tuple(slots),
            )
        )
    return nodes


def ranges(slots: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as inclusive ranges."""
    found: list[tuple[int, int]] = []
    for slot in sorted(slots):
        if found and found[-1][1] == slot - 1:
            found[-1] = (found[-1][0], slot)
        else:
            found.append((slot, slot))
    return found


def ranges_text(spans: Sequence[tuple[int, int]], most: int = 4) -> str:
    words = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    if len(words) > most:
        words = [*words[:most], f"... ({len(words) - most} more ranges)"]
    return ",".join(words) or "-"


@dataclass
class PrimaryShare:
    node: Node
    replicas: list[Node]
    slot_count: int
    shards: int = 0
    sessions: int | None = 0  # None: its shards could not be counted (it did not answer)


@dataclass
class ShardPlace:
    """Where one shard lives: the slot of its hash tag and the primary serving it."""

    shard: int
    prefix: str  # its keys' prefix, hash tag included (gm:{0}:)
    slot: int
    primary: str | None  # its address; None: nobody serves the slot
    sessions: int | None  # None: not counted


@dataclass
class ClusterReport:
    seen_from: str  # the node asked, as said to a person (no password)
    cluster_state: str
    primaries: list[PrimaryShare]
    unserved: list[tuple[int, int]]  # slot ranges no healthy primary serves
    namespace: str
    shards: int
    places: list[ShardPlace] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def unserved_shards(self) -> int:
        """Shards whose slot nobody serves: their sessions are unknown."""
        return sum(1 for place in self.places if place.primary is None)

    @property
    def unserved_count(self) -> int:
        return sum(b - a + 1 for a, b in self.unserved)

    @property
    def healthy(self) -> bool:
        return not self.unserved and not self.problems


def owners(nodes: Sequence[Node]) -> list[Node | None]:
    """The primary serving each slot, None where no primary that has not failed does."""
    owner: list[Node | None] = [None] * SLOTS
    for node in nodes:
        if not node.is_primary or node.failed:
            continue
        for first, last in node.slots:
            for slot in range(first, min(last, SLOTS - 1) + 1):
                owner[slot] = node
    return owner


def check(
    seed: redis.Redis,
    seen_from: str,
    keys: KeySpace,
    connect: Callable[[str], redis.Redis],
) -> ClusterReport:
    """What the node `seed` says of the cluster, and the store's sessions per primary.

    `connect(host_port)` gives a client of another node (the seed's credentials)."""
    info = _cluster_info(seed, seen_from)
    text = _ask(seed, "CLUSTER", "NODES")
    nodes = parse_nodes(text.decode() if isinstance(text, bytes) else str(text))
    owner = owners(nodes)
    shares = {
        node.node_id: PrimaryShare(
            node,
            [n for n in nodes if n.primary_id == node.node_id],
            sum(1 for o in owner if o is node),
        )
        for node in nodes
        if node.is_primary and (node.slots or not node.failed)
    }
    report = ClusterReport(
        seen_from=seen_from,
        cluster_state=info.get("cluster_state", "?"),
        primaries=sorted(shares.values(), key=lambda s: _first_slot(s.node)),
        unserved=ranges(slot for slot, o in enumerate(owner) if o is None),
        namespace=keys.namespace,
        shards=keys.shards,
    )
    _count_sessions(report, keys, owner, shares, connect)
    return report


def _cluster_info(seed: redis.Redis, seen_from: str) -> dict[str, str]:
    try:
        raw = _ask(seed, "CLUSTER", "INFO")
    except redis.ResponseError as exc:
        if "cluster support disabled" in str(exc).lower():
            raise ConfigError(
                f"{seen_from} is a single server, not a cluster node (cluster-enabled no): "
                "cluster-check is for Valkey/Redis Cluster"
            ) from None
        raise
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)


def _ask(client: redis.Redis, *command: str) -> Any:
    return Executor(client).command(*command)  # the only code that sends commands


def _first_slot(node: Node) -> int:
    return min((a for a, _ in node.slots), default=SLOTS)


def _count_sessions(
    report: ClusterReport,
    keys: KeySpace,
    owner: list[Node | None],
    shares: dict[str, PrimaryShare],
    connect: Callable[[str], redis.Redis],
) -> None:
    """ZCARD of each shard's session index, on the primary owning the shard's slot."""
    clients: dict[str, redis.Redis] = {}
    try:
        for shard in keys.all_shards():
            slot = key_slot(shard.sessions.encode())
            node = owner[slot]
            place = ShardPlace(shard.shard, keys.prefix(shard.shard), slot, None, None)
            report.places.append(place)
            if node is None:
                continue
            place.primary = node.address
            share = shares[node.node_id]
            share.shards += 1
            if share.sessions is None:
                continue
            try:
                if node.address not in clients:
                    clients[node.address] = connect(node.address)
                place.sessions = int(_ask(clients[node.address], "ZCARD", shard.sessions))
                share.sessions += place.sessions
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                # unreachable, or refusing (CLUSTERDOWN: it sees part of the cluster down)
                share.sessions = None
                report.problems.append(f"primary {node.address} did not count: {exc}")
    finally:
        for client in clients.values():
            client.close()


def render(report: ClusterReport, by_shard: bool = False) -> str:
    """The report as a person reads it: a summary line, a table, what is wrong; with
    `by_shard`, a second table: each shard's slot and primary (to plan a reshard)."""
    served = SLOTS - report.unserved_count
    lines = [
        f"cluster seen from {report.seen_from}: cluster_state {report.cluster_state}, "
        f"{served:,} of {SLOTS:,} slots served"
    ]
    counted = [s.sessions for s in report.primaries if s.sessions is not None]
    total = sum(counted)
    partly = len(counted) < len(report.primaries)
    rows = []
    for share in report.primaries:
        replicas = ", ".join(
            r.address + ("" if r.state == "ok" else f" ({r.state})") for r in share.replicas
        )
        if share.sessions is None:
            sessions, percent = "?", "?"
        else:
            sessions = f"{share.sessions:,}"
            percent = f"{100 * share.sessions / total:.1f}%" if total else "-"
        rows.append(
            [
                share.node.address,
                share.node.state,
                f"{share.slot_count:,}",
                ranges_text(sorted(share.node.slots)),
                replicas or "none",
                str(share.shards),
                sessions,
                percent,
            ]
        )
    header = ["primary", "state", "slots", "ranges", "replicas", "shards", "sessions", "share"]
    lines.append(_table(header, rows))
    summary = f"store '{report.namespace}': {total:,} sessions in {report.shards} shards"
    if partly:
        summary += " (counted on the primaries that answered; the shares are of those)"
    if report.unserved_shards:
        summary += f" ({report.unserved_shards} of them on slots nobody serves: not counted)"
    lines.append(summary)
    if by_shard:
        shard_rows = [
            [
                str(place.shard),
                place.prefix,
                str(place.slot),
                place.primary or "NOBODY",
                "?" if place.sessions is None else f"{place.sessions:,}",
            ]
            for place in report.places
        ]
        lines.append(_table(["shard", "keys", "slot", "primary", "sessions"], shard_rows))
    if report.unserved:
        lines.append(
            f"NOT SERVED: {report.unserved_count:,} slots ({ranges_text(report.unserved, 8)}): "
            "keys there can be neither read nor written"
        )
    lines.extend(f"PROBLEM: {p}" for p in report.problems)
    for share in report.primaries:
        if not share.replicas and share.slot_count:
            lines.append(
                f"note: primary {share.node.address} has no replica: its failure leaves "
                "its slots unserved"
            )
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def run(url: str, keys: KeySpace, *, by_shard: bool = False) -> tuple[int, str]:
    """(exit status, report) for the cluster of the node at `url`: 0 when every slot
    is served and every primary answered, else 1."""
    seed = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    # the other nodes with the seed's credentials and TLS; over TCP, even when the
    # seed was a Unix socket: the cluster announces host:port addresses only
    base = dict(seed.connection_pool.connection_kwargs)
    pool_class = seed.connection_pool.connection_class
    if issubclass(pool_class, redis.UnixDomainSocketConnection):
        base.pop("path", None)
        pool_class = redis.Connection

    def connect(address: str) -> redis.Redis:
        host, _, port = address.rpartition(":")
        kwargs = {**base, "host": host, "port": int(port), "db": 0}
        return redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool_class, **kwargs)
        )

    try:
        report = check(seed, redacted_url(url), keys, connect)
    finally:
        seed.close()
    return (0 if report.healthy else 1), render(report, by_shard)
