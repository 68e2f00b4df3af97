"""Limits have hard ceilings; settings load from TOML with GRIDMEM_* overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gridmem import ConfigError
from gridmem import ConversationConfig
from gridmem import Limits
from gridmem import Settings
from gridmem.config import LIMIT_TABLE
from gridmem.config import shard_limits
from gridmem.scripts import LIMIT_FIELDS
from gridmem.scripts import limits_packet
from gridmem.store import open_store

DESIGN_CEILINGS = {
    "max_active_sessions": 1_000_000,
    "max_turns_per_session": 5_000,
    "max_session_bytes": 8 * 1024**2,
    "max_aggregate_bytes": 16 * 1024**3,
    "max_tool_results_per_session": 500,
    "max_tool_result_bytes": 64 * 1024,
    "max_text_bytes": 64 * 1024,
    "max_summary_bytes": 256 * 1024,
    "max_events": 1_000_000,
    "max_snapshot_bytes": 64 * 1024**3,
    "max_archive_segments": 1_000,
    "max_archive_bytes": 64 * 1024**2,
    "max_input_bytes": 1024**2,
}


def test_every_limit_exists_with_default_within_ceiling() -> None:
    assert set(Limits.model_fields) == set(DESIGN_CEILINGS) == set(LIMIT_TABLE)
    limits = Limits()
    for name, ceiling in DESIGN_CEILINGS.items():
        default, code_ceiling = LIMIT_TABLE[name]
        assert code_ceiling >= ceiling  # callers rely on at least the documented ceilings
        assert 1 <= getattr(limits, name) == default <= code_ceiling


# Session and shard totals at their ceilings leave room for every other limit's ceiling.
ROOMY = {"max_session_bytes": 8 * 1024**2, "max_aggregate_bytes": 16 * 1024**3}


@pytest.mark.parametrize("name", sorted(DESIGN_CEILINGS))
def test_above_ceiling_is_refused_naming_field_and_ceiling(name: str) -> None:
    ceiling = LIMIT_TABLE[name][1]
    Limits(**{**ROOMY, name: ceiling})  # at the ceiling: fine
    with pytest.raises(ValidationError, match=rf"{name}.*hard ceiling {ceiling}"):
        Limits(**{**ROOMY, name: ceiling + 1})
    with pytest.raises(ValidationError):
        Limits(**{**ROOMY, name: 0})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_session_bytes": 8192}, "max_session_bytes = 8192 must be at least"),
        ({"max_summary_bytes": 250_000}, "max_session_bytes"),
        ({"max_aggregate_bytes": 1000}, "max_aggregate_bytes must be at least"),
        ({"max_text_bytes": 9000, "max_input_bytes": 8000}, "max_text_bytes must not exceed"),
    ],
)
def test_limits_that_cannot_hold_together_are_refused(values: dict[str, int], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Limits(**values)


def test_conversation_defaults() -> None:
    config = ConversationConfig()
    assert (config.persistence_enabled, config.archive_enabled) == (False, False)
    assert (config.namespace, config.shards) == ("gm", 1)
    with pytest.raises(ValidationError):
        ConversationConfig(namespace="Bad Space")


def test_settings_from_toml_with_env_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gridmem.toml"
    path.write_text(
        'storage_path = "/srv/gridmem"\n'
        '[redis]\nurl = "redis://localhost:6379/0"\n'
        "[conversation]\npersistence_enabled = true\n"
        "[conversation.limits]\nmax_turns_per_session = 50\nmax_events = 99\n"
        "[worker]\nprocesses = 3\n"
    )
    monkeypatch.setenv("GRIDMEM_CONVERSATION__LIMITS__MAX_EVENTS", "77")
    monkeypatch.setenv("GRIDMEM_REDIS__URL", "unix:///tmp/x.sock")
    settings = Settings.load(path)
    assert settings.storage_path == Path("/srv/gridmem")
    assert settings.redis.url == "unix:///tmp/x.sock"
    assert settings.conversation.persistence_enabled is True
    assert settings.conversation.limits.max_turns_per_session == 50  # from the file
    assert settings.conversation.limits.max_events == 77  # env wins
    assert settings.worker.processes == 3


def test_settings_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[conversation.limits]\nmax_turns_per_session = 999999\n")
    with pytest.raises(ConfigError, match=r"conversation\.limits\.max_turns_per_session.*5000"):
        Settings.load(path)
    path.write_text("[conversation]\npersistance_enabled = true\n")  # misspelt
    with pytest.raises(ConfigError, match="persistance_enabled"):
        Settings.load(path)
    path.write_text("not [toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.load(path)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(tmp_path / "missing.toml")


# -- splitting the global bounds over shards (issue 12 item 5) -------------------------


def _packet_shares(limits: Limits, shards: int) -> tuple[int, int]:
    """The per-shard session and byte bounds as record_turn receives them."""
    fields = dict(zip(LIMIT_FIELDS, limits_packet(limits, shards).split(","), strict=True))
    return int(fields["max_sessions"]), int(fields["max_aggregate_bytes"])


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 16, 1000, 1024])
@pytest.mark.parametrize("sessions", [1, 2, 3, 10, 1_001, 10_000, 1_000_000])
@pytest.mark.parametrize("aggregate", [256 * 1024**2, 3 * 256 * 1024**2 + 1, 16 * 1024**3])
def test_shard_shares_never_sum_past_the_global_bounds(
    shards: int, sessions: int, aggregate: int
) -> None:
    limits = Limits(max_active_sessions=sessions, max_aggregate_bytes=aggregate)
    if sessions < shards or aggregate // shards < limits.max_session_bytes:
        with pytest.raises(ValidationError, match="cannot be split over"):
            ConversationConfig(shards=shards, limits=limits)
        return
    ConversationConfig(shards=shards, limits=limits)
    per_shard_sessions, per_shard_bytes = _packet_shares(limits, shards)
    # the shares sum to at most the global bounds, and lose less than one unit per shard
    assert sessions - shards < shards * per_shard_sessions <= sessions
    assert aggregate - shards < shards * per_shard_bytes <= aggregate
    assert per_shard_sessions >= 1 and per_shard_bytes >= limits.max_session_bytes


@pytest.mark.parametrize(
    ("shards", "values", "message"),
    [
        (4, {"max_active_sessions": 2}, r"max_active_sessions = 2 cannot be split over shards = 4"),
        (16, {"max_active_sessions": 15}, r"each shard needs at least one session"),
        (
            4,
            {"max_session_bytes": 256 * 1024, "max_aggregate_bytes": 4 * 256 * 1024 - 1},
            r"max_aggregate_bytes = 1048575 cannot be split over shards = 4: each shard's "
            r"share \(262143 bytes\) must hold one session \(max_session_bytes = 262144\)",
        ),
        (3, {"max_aggregate_bytes": 3 * 256 * 1024 - 1}, r"at least shards x max_session_bytes"),
    ],
)
def test_a_config_that_cannot_be_split_over_its_shards_is_refused(
    shards: int, values: dict[str, int], message: str, tmp_path: Path
) -> None:
    limits = Limits(**values)
    with pytest.raises(ValidationError, match=message):
        ConversationConfig(shards=shards, limits=limits)
    with pytest.raises(ValueError, match="cannot be split over"):
        limits_packet(limits, shards)  # nor can a packet be built for it
    # from a settings file too, naming the section
    path = tmp_path / "gridmem.toml"
    lines = "".join(f"{name} = {value}\n" for name, value in values.items())
    path.write_text(f"[conversation]\nshards = {shards}\n[conversation.limits]\n{lines}")
    with pytest.raises(ConfigError, match=rf"conversation: .*{message}"):
        Settings.load(path)
    # at the exact edge it is accepted
    edge = {**values}
    if "max_active_sessions" in values:
        edge["max_active_sessions"] = shards
    else:
        edge["max_aggregate_bytes"] = shards * limits.max_session_bytes
    ConversationConfig(shards=shards, limits=Limits(**edge))


@pytest.mark.parametrize("shards", [1, 3, 4, 16])
def test_with_the_archive_each_share_holds_a_session_and_its_archive(
    shards: int, tmp_path: Path
) -> None:
    """Regression (issue 12 item 5, second pass): archived records count in the shard's
    byte total, but a share only had to hold max_session_bytes, so each shard's one
    session (never evicted while written) could pass its share by a whole archive,
    and the shards together the global bound."""
    session, archive = 256 * 1024, 1024 * 1024  # the defaults, written out
    footprint = session + archive
    below = Limits(max_archive_bytes=archive, max_aggregate_bytes=shards * footprint - 1)
    # Given limits whose shares hold a session but not a session and its archive:
    # accepted with the archive off
    ConversationConfig(shards=shards, limits=below)
    limits_packet(below, shards, archive=False)
    # Then with it on they are refused, with a message that says why and what would do
    message = (
        rf"max_aggregate_bytes = {shards * footprint - 1} cannot be split over "
        rf"shards = {shards} with the archive on: each shard's share "
        rf"\({(shards * footprint - 1) // shards} bytes\) must hold one session and its "
        rf"archive \(max_session_bytes \+ max_archive_bytes = {footprint}\); "
        rf"max_aggregate_bytes must be at least shards x \(max_session_bytes \+ "
        rf"max_archive_bytes\) = {shards * footprint}, or lower max_archive_bytes"
    )
    with pytest.raises(ValidationError, match=message):
        ConversationConfig(shards=shards, limits=below, archive_enabled=True)
    with pytest.raises(ValueError, match=message):
        limits_packet(below, shards, archive=True)
    path = tmp_path / "gridmem.toml"
    path.write_text(
        f"[conversation]\nshards = {shards}\narchive_enabled = true\n"
        f"[conversation.limits]\nmax_aggregate_bytes = {shards * footprint - 1}\n"
    )
    with pytest.raises(ConfigError, match=rf"conversation: .*{message}"):
        Settings.load(path)
    # and at the edge they are accepted, each share holding exactly one footprint
    edge = Limits(max_archive_bytes=archive, max_aggregate_bytes=shards * footprint)
    ConversationConfig(shards=shards, limits=edge, archive_enabled=True)
    fields = dict(zip(LIMIT_FIELDS, limits_packet(edge, shards, True).split(","), strict=True))
    assert int(fields["max_aggregate_bytes"]) == footprint
    assert int(fields["archive"]) == 1


@pytest.mark.parametrize("shards", [1, 3, 4, 16])
def test_max_events_is_split_over_the_shards_event_streams(shards: int, tmp_path: Path) -> None:
    """Regression (issue 12 item 5, attack pass): every shard's event stream was trimmed
    to max_events, so N shards held N x max_events events. Each gets its share."""
    for max_events in (shards, shards + 1, 7 * shards + shards - 1, 10_000):
        share = shard_limits(Limits(max_events=max_events), shards).max_events
        assert max_events - shards < shards * share <= max_events and share >= 1
    if shards == 1:
        return
    message = (
        rf"max_events = {shards - 1} cannot be split over shards = {shards}: each shard's "
        rf"event stream needs at least one event \(max_events must be at least shards\)"
    )
    with pytest.raises(ValidationError, match=message):
        ConversationConfig(shards=shards, limits=Limits(max_events=shards - 1))
    path = tmp_path / "gridmem.toml"
    path.write_text(
        f"[conversation]\nshards = {shards}\n[conversation.limits]\nmax_events = {shards - 1}\n"
    )
    with pytest.raises(ConfigError, match=rf"conversation: .*{message}"):
        Settings.load(path)


@pytest.mark.parametrize("source", ["default", "file", "environment"])
def test_a_relative_storage_path_is_made_absolute_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Regression (issue 13, item 1): a relative storage_path (the default `gridmem-data`)
    stayed relative in Settings; the private Valkey, which runs in its --dir, got a
    relative log path and died with a log that did not exist. Now Settings.load makes
    it absolute against the working directory at load time (the documented base),
    whatever the process does with its working directory afterwards."""
    # Given a config (or the default, or an override) naming a relative storage_path
    config = tmp_path / "conf" / "gridmem.toml"
    config.parent.mkdir()
    config.write_text('storage_path = "data/here"\n' if source == "file" else "")
    if source == "environment":
        monkeypatch.setenv("GRIDMEM_STORAGE_PATH", "data/here")
    monkeypatch.chdir(tmp_path)
    # When it is loaded in tmp_path, and the process then moves elsewhere
    settings = Settings.load(config)
    monkeypatch.chdir(config.parent)
    # Then the path is tmp_path's, absolute (not the config file's folder, not the new cwd)
    expected = tmp_path / ("gridmem-data" if source == "default" else "data/here")
    assert settings.storage_path == expected and settings.storage_path.is_absolute()


@pytest.mark.parametrize("source", ["file", "environment"])
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_storage_path_is_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, blank: str
) -> None:
    """Regression (issue 13, found by trying it): `storage_path = ""`, or an empty
    GRIDMEM_STORAGE_PATH (set from a variable that was not), was read as ".": the
    working directory became the store, its serve.lock, valkey/ and snapshots strewn
    in it. Now it is a configuration error naming the field."""
    # Given a blank storage_path in the file or the environment
    config = tmp_path / "gridmem.toml"
    config.write_text(f'storage_path = "{blank}"\n' if source == "file" else "")
    if source == "environment":
        monkeypatch.setenv("GRIDMEM_STORAGE_PATH", blank)
    monkeypatch.chdir(tmp_path)
    # When the settings are loaded, Then they are refused, naming the field
    with pytest.raises(ConfigError, match=r"storage_path.*must name a directory"):
        Settings.load(config)


def _redis_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(f"GRIDMEM_REDIS__{name.upper()}", value)
    return Settings.load()


def test_cluster_and_durability_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"redis.*cluster = true needs a url of one cluster node"):
        _redis_env(monkeypatch, cluster="true")
    with pytest.raises(ConfigError, match=r"redis.*cluster = true needs a url"):
        _redis_env(monkeypatch, cluster="true", url="unix:///tmp/gm.sock")
    monkeypatch.delenv("GRIDMEM_REDIS__CLUSTER")
    with pytest.raises(ConfigError, match=r"redis\.durability"):
        _redis_env(monkeypatch, url="redis://127.0.0.1:1", durability="all")
    replica = _redis_env(monkeypatch, durability="replica")
    assert replica.redis.durability == "replica" and not replica.redis.cluster
    store = open_store(replica, "redis://127.0.0.1:1")  # no connection until a call
    assert store.executor.durable  # every state change waits for a replica (test_durability)
    store.close()
