"""The service streams' partitions: which one an avatar's messages go to, and each one's
cluster hash tag (docs/streams.md, "Partitions").

With `[conversation] partitions = P` above 1, the inbound, outbound and dead streams
(and the inbound queue's bookkeeping) are P sets of keys, each under its own hash
tag, so each partition lives in one Redis Cluster slot and the partitions spread
over the cluster's masters. Both are defined here so that a bridge in any language
can compute them:

- the partition of a message is `crc32(avatar UUID, lowercase 8-4-4-4-12, as UTF-8)
  mod P` (zlib's CRC-32, the one of PNG, gzip and Ethernet), so both channels of an
  avatar share a partition;
- the tag of partition p is `p<p>.<k>` for the smallest k >= 0 whose cluster slot
  (CRC16-XMODEM of the tag, mod 16384: what CLUSTER KEYSLOT computes) lies in the
  p-th of P equal ranges of slots (`slot * P // 16384 == p`). Tags picked by slot,
  not numbered `{0}`, `{1}`..., whose slots fall where they fall: so partition p
  sits on the master that owns the p-th share of the slots, and P partitions over
  M masters give each master P/M of them (+-1) when the slots are split evenly.

With P = 1 nothing is partitioned and every key keeps the name it always had
(gridmem/keys.py KeySpace.service).
"""

from __future__ import annotations

import binascii
import functools
import zlib

from gridmem.validate import canonical_uuid

CLUSTER_SLOTS = 16384
# Each worker process keeps one blocking read per partition while idle: the bound
# keeps that (and the tag search below) small.
MAX_PARTITIONS = 256


def partition_of(avatar_uuid: str, partitions: int) -> int:
    """The partition (0 .. partitions - 1) an avatar's messages go to, on both channels:
    `zlib.crc32(uuid.lower().encode("utf-8")) % partitions`. The UUID is checked first
    (8-4-4-4-12 hexadecimal, any case; InvalidAvatarId otherwise)."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError("partitions must be an integer >= 1")
    return zlib.crc32(canonical_uuid(avatar_uuid).encode("utf-8")) % partitions


def cluster_slot(tag: str) -> int:
    """The Redis Cluster slot of a hash tag (CLUSTER KEYSLOT of `{tag}`)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % CLUSTER_SLOTS


@functools.cache
def partition_tags(partitions: int) -> tuple[str, ...]:
    """The hash tag of each partition (module docstring): `p<p>.<k>`, k the smallest
    putting its slot in the p-th equal share of the 16384 slots."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be within 1..{MAX_PARTITIONS}")
    tags = []
    for p in range(partitions):
        k = 0
        while cluster_slot(f"p{p}.{k}") * partitions // CLUSTER_SLOTS != p:
            k += 1
        tags.append(f"p{p}.{k}")
    return tuple(tags)
