"""Operating a store on a real Valkey Cluster: bin/gridmem-cli and `gridmem cluster-check`.

One 3-primary, 3-replica cluster for the module (about 2 s to start). The store's
shards are tagged so that they land on every primary: the CLI must follow the
cluster (redis-cli -c) to read them, and cluster-check must count each shard on the
primary that owns it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gridmem import AgentReply
from gridmem import AvatarMessage
from gridmem import ConversationConfig
from gridmem import ConversationStore
from gridmem.embedded import EmbeddedCluster
from gridmem.embedded import EmbeddedValkey
from gridmem.embedded import cli_binary
from gridmem.keys import KeySpace
from tests.conftest import short_tempdir
from tests.helpers import avatar
from tests.test_operator_cli import _acl_recipes
from worker.cli import main
from worker.cluster_check import SLOTS
from worker.cluster_check import owners
from worker.cluster_check import parse_nodes
from worker.cluster_check import ranges

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "bin" / "gridmem-cli"
SHARDS = 6  # shard_tags: two equal slot ranges inside each of the three primaries
RESIDENTS = [avatar(n) for n in range(12)]
MARK = "GUAVA-MARKER"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    directory = short_tempdir("gm-cl-")
    try:
        with EmbeddedCluster(directory) as started:
            yield started
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def store(cluster: EmbeddedCluster, real_servers: dict[str, EmbeddedValkey]) -> ConversationStore:
    """A store of 12 residents (24 sessions) in 4 shards, on the cluster.

    Written on a single node and copied key by key (DUMP/RESTORE) into the cluster,
    until the store's cluster door lands (issue 15, core): the keys are the store's
    own either way, and this store still answers for what it wrote."""
    node = real_servers["valkey"].client()
    node.flushall()
    store = ConversationStore(node, ConversationConfig(shards=SHARDS))
    for uuid in RESIDENTS:
        for channel in ("public", "im"):
            store.record(uuid, channel, AvatarMessage(text=f"{MARK} hello"))
            store.record(uuid, channel, AgentReply(text="hi"))
    target = cluster.client()
    try:
        for key in node.keys("*"):
            target.restore(key, 0, node.dump(key), replace=True)
    finally:
        target.close()
    return store


def gm(cluster: EmbeddedCluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """bin/gridmem-cli against the cluster's first node (valkey-cli)."""
    return subprocess.run(
        [str(CLI), "--url", cluster.url, *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env={**os.environ, "GRIDMEM_REDIS_CLI": cli_binary(), **env},
    )


def held_by_primary(cluster: EmbeddedCluster, keys: list[str]) -> dict[int, int]:
    """ZCARD of each key, summed per primary port: asked of every primary, counted where
    it answers (the others redirect). What cluster-check must find, found without it."""
    found: dict[int, int] = {}
    for port in cluster.primaries():
        client = cluster.node_client(port)
        try:
            for key in keys:
                with contextlib.suppress(redis.exceptions.MovedError):
                    found[port] = found.get(port, 0) + int(client.zcard(key))
        finally:
            client.close()
    return found


@pytest.mark.real
def test_the_cli_follows_the_cluster(cluster: EmbeddedCluster, store: ConversationStore) -> None:
    # Given the store's four shards on three primaries, and a node named by --url
    # When each command runs with --cluster (or GRIDMEM_REDIS__CLUSTER=true)
    # Then each reads every shard, wherever it lives
    listed = gm(cluster, "--cluster", "sessions", "--limit", "1000", "--json")
    assert listed.returncode == 0, listed.stderr
    expected = {m.session_id for m in store.list_metadata(limit=1000).items}
    assert {i["session_id"] for i in json.loads(listed.stdout)["items"]} == expected
    assert len(expected) == 2 * len(RESIDENTS)
    stats = gm(cluster, "stats", "--json", GRIDMEM_REDIS__CLUSTER="True")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["sessions"] == {"public": 12, "im": 12}
    page = gm(cluster, "-c", "transcript", RESIDENTS[5], "IM", "--show-content", "--json")
    assert page.returncode == 0 and MARK in page.stdout, page.stderr
    gone = gm(cluster, "-c", "delete", RESIDENTS[7], "public")
    assert gone.returncode == 0, gone.stderr
    events = gm(cluster, "-c", "events", "--json")
    assert [e["avatar_uuid"] for e in json.loads(events.stdout)] == [RESIDENTS[7]]


@pytest.mark.real
def test_without_cluster_mode_the_cli_says_to_add_it(
    cluster: EmbeddedCluster, store: ConversationStore
) -> None:
    # the layout is on the first node, its shards are not: redirected, and told so
    refused = gm(cluster, "stats", GRIDMEM_REDIS__CLUSTER="")
    assert refused.returncode == 1
    assert "MOVED" in refused.stderr and "add --cluster" in refused.stderr, refused.stderr
    typo = gm(cluster, "stats", GRIDMEM_REDIS__CLUSTER="ture")
    assert typo.returncode == 2 and "GRIDMEM_REDIS__CLUSTER" in typo.stderr


@pytest.mark.real
def test_the_documented_viewer_works_on_the_cluster(
    cluster: EmbeddedCluster, store: ConversationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operations.md: ACL users are per node, created on every node with
    `valkey-cli --cluster call`; the viewer then lists sessions through --cluster
    (redirected connections log in as it too) and runs cluster-check."""
    words = [w.replace("CHANGE-ME", "pw-view") for w in _acl_recipes()["gridmem-viewer"]]
    call = [cli_binary(), "--cluster", "call", f"127.0.0.1:{cluster.ports[0]}", "ACL", "SETUSER"]
    made = subprocess.run([*call, *words], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    viewer = f"redis://gridmem-viewer:pw-view@127.0.0.1:{cluster.ports[0]}"
    listed = gm(cluster, "--url", viewer, "--cluster", "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["items"]) >= 2 * len(RESIDENTS) - 1
    refused = gm(cluster, "--url", viewer, "-c", "transcript", RESIDENTS[5], "im", "--show-content")
    assert refused.returncode == 1 and MARK not in refused.stdout
    assert main(["cluster-check", "--url", viewer]) == 0, capsys.readouterr()


@pytest.mark.real
def test_cluster_check_counts_each_primarys_sessions(
    cluster: EmbeddedCluster,
    store: ConversationStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GRIDMEM_CONVERSATION__SHARDS", str(SHARDS))
    assert main(["cluster-check", "--url", cluster.url, "--by-shard"]) == 0
    out = capsys.readouterr().out
    assert "16,384 of 16,384 slots served" in out and "NOT SERVED" not in out
    indexes = [shard.sessions for shard in KeySpace("gm", SHARDS).all_shards()]
    expected = held_by_primary(cluster, indexes)
    total = sum(expected.values())
    assert len(expected) == 3 and total in {23, 24}  # 24, less one if the CLI deleted it
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:5]}
    for port, sessions in expected.items():
        row = rows[f"127.0.0.1:{port}"]
        replicas = ",".join(f"127.0.0.1:{r}" for r in cluster.replicas_of(port))
        assert row[1] == "ok" and row[4] == replicas and row[6] == str(sessions), (row, out)
    assert f"store 'gm': {total} sessions in {SHARDS} shards" in out
    # --by-shard: each shard on the one primary that answers for its index
    shard_rows = out.split("\nshard ")[1].splitlines()[1:]
    assert len(shard_rows) == SHARDS
    for row, key in zip(shard_rows, indexes, strict=True):
        _, prefix, slot, primary, sessions = row.split()
        [(port, held)] = held_by_primary(cluster, [key]).items()
        assert key.startswith(prefix) and primary == f"127.0.0.1:{port}" and int(sessions) == held
        assert int(slot) == int(cluster.client().cluster_keyslot(key))


@pytest.mark.real
def test_cluster_check_fails_on_a_slot_nobody_serves(
    cluster: EmbeddedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the primary of a shard's slot, which drops that slot (in its own view,
    # which cluster-check reads: nobody serves it; the others do not hear of it)
    key = KeySpace("gm", SHARDS).shard(3).sessions
    [primary] = held_by_primary(cluster, [key])
    node = cluster.node_client(primary)
    slot = int(node.execute_command("CLUSTER", "KEYSLOT", key))
    node.execute_command("CLUSTER", "DELSLOTS", slot)
    try:
        # When cluster-check asks that node
        status = main(["cluster-check", "--url", f"redis://127.0.0.1:{primary}"])
        out = capsys.readouterr().out
    finally:
        node.execute_command("CLUSTER", "ADDSLOTS", slot)
        node.close()
        cluster.wait_healthy()
    # Then it names the slot and fails
    assert status == 1, out
    assert f"{SLOTS - 1:,} of {SLOTS:,} slots served" in out
    assert f"NOT SERVED: 1 slots ({slot})" in out


def test_parse_nodes_reads_failures_migrations_and_hostnames() -> None:
    """CLUSTER NODES as a failover and a reshard leave it: a failed primary serves
    nothing, a migrating slot is still its owner's, a hostname after the address."""
    text = (
        "a1 10.0.0.1:6379@16379,valkey-1 myself,master - 0 0 1 connected 0-5000 [5001->-b2]\n"
        "b2 10.0.0.2:6379@16379 master,fail - 0 0 2 connected 5001-10000\n"
        "c3 10.0.0.3:6379@16379 master - 0 0 3 connected 10001-16383 [5001-<-a1]\n"
        "d4 10.0.0.4:6379@16379 slave,fail? a1 0 0 1 connected\n"
        "e5 :0@0 noaddr,handshake - 0 0 0 disconnected\n"
    )
    nodes = parse_nodes(text)
    assert [n.address for n in nodes] == [f"10.0.0.{n}:6379" for n in (1, 2, 3, 4)]
    assert nodes[0].slots == ((0, 5000),) and nodes[2].slots == ((10001, 16383),)
    assert nodes[3].primary_id == "a1" and nodes[3].state == "suspected (fail?)"
    served = owners(nodes)
    assert ranges(s for s, o in enumerate(served) if o is None) == [(5001, 10000)]
    assert served[0] is nodes[0] and served[SLOTS - 1] is nodes[2]


@pytest.mark.real
def test_cluster_check_refuses_what_is_not_a_cluster(
    real_servers: dict[str, EmbeddedValkey],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("GRIDMEM_REDIS__URL", raising=False)
    assert main(["cluster-check"]) == 2
    assert "--url" in capsys.readouterr().err
    assert main(["cluster-check", "--url", real_servers["valkey"].url]) == 2
    assert "not a cluster node" in capsys.readouterr().err
