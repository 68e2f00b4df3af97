"""Prometheus metrics: counts and timings, never content, never UUIDs.

Worker processes record into prometheus-client's multiprocess files
(PROMETHEUS_MULTIPROC_DIR, which the supervisor sets before it spawns them).
The supervisor serves those, together with what the store itself counts
(sessions per channel, stored bytes, redactions, events by reason: read from
Redis at scrape time), on 127.0.0.1:<[metrics] port>. Labels are kinds,
channels, reason codes and outcomes: fixed, small sets.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client import multiprocess
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_LLM_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

RECORDS = Counter("gridmem_records_total", "Records stored by the worker service.", ["kind"])
RECORD_SECONDS = Histogram("gridmem_record_seconds", "Time to store one record.", buckets=_LATENCY)
CONTEXT_SECONDS = Histogram(
    "gridmem_context_seconds",
    "Time to store a resident's words and read the context they leave (one round trip).",
    buckets=_LATENCY,
)
LLM_SECONDS = Histogram(
    "gridmem_llm_seconds", "Time for the LLM to answer, retries included.", buckets=_LLM_LATENCY
)
LLM_ERRORS = Counter(
    "gridmem_llm_errors_total", "LLM calls that failed after their retries.", ["kind"]
)
MESSAGES = Counter(
    "gridmem_messages_total",
    "Inbound entries handled: answered, failure_notice, republished, dead_lettered; "
    "and failed_attempt (an attempt that raised; retried or dead-lettered as poison).",
    ["outcome"],
)


class StoreCollector(Collector):
    """Gauges and counters the store keeps itself, read at scrape time."""

    def __init__(self, stats: Any) -> None:
        self._stats = stats  # a callable returning StoreStats

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        sessions = GaugeMetricFamily("gridmem_sessions", "Live sessions.", labels=["channel"])
        for channel, count in stats.sessions.items():
            sessions.add_metric([channel.value], count)
        yield sessions
        yield GaugeMetricFamily(
            "gridmem_stored_bytes", "Bytes stored (all shards).", value=stats.stored_bytes
        )
        yield CounterMetricFamily(
            "gridmem_redactions", "Secrets redacted before storage.", value=stats.redactions
        )
        events = CounterMetricFamily("gridmem_events", "Events published.", labels=["reason"])
        for reason, count in stats.events.items():
            events.add_metric([reason.value], count)
        yield events


def prepare_multiprocess_dir(directory: Path) -> None:
    """An empty private directory for the workers' metric files; set for processes spawned next."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(mode=0o700, parents=True)
    os.environ[MULTIPROC_ENV] = str(directory)


def serve(port: int, directory: Path, stats: Any) -> Any:
    """Serve the workers' metrics and the store's on 127.0.0.1:port. Returns the server."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    registry.register(StoreCollector(stats))
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server


def process_gone(pid: int, directory: Path) -> None:
    """Drop a dead worker's live gauges (its counters stay summed)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
