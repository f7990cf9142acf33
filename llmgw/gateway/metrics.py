"""Prometheus metrics, one set per process.

With several gunicorn workers each is its own process, so `llmgw serve` points
PROMETHEUS_MULTIPROC_DIR at a fresh directory (removed when it exits) and /metrics sums
the workers' files; without it (one process, e.g. in a debugger) the default registry
answers.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import REGISTRY as _DEFAULT

# LLM answers range from a cached embedding (milliseconds) to a long generation (minutes).
_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
)

REQUESTS = Counter("llmgw_requests", "Requests answered, by model and status.", ["model", "status"])
LATENCY = Histogram(
    "llmgw_request_duration_seconds", "Time from request to last byte.", ["model"], buckets=_BUCKETS
)
FIRST_BYTE = Histogram(
    "llmgw_time_to_first_byte_seconds",
    "Time from request to the first byte of the upstream's answer.",
    ["model"],
    buckets=_BUCKETS,
)
UPSTREAM_ERRORS = Counter(
    "llmgw_upstream_errors",
    "Upstream failures: connect, timeout, status (5xx), broken (cut mid-answer).",
    ["replica", "kind"],
)
REPLICA_HEALTHY = Gauge(
    "llmgw_replica_healthy",
    "1 while a replica is in rotation, per worker.",
    ["replica"],
    multiprocess_mode="liveall",
)
PLAN_INFO = Gauge(
    "llmgw_plan_info",
    "1 for the plan digest a worker serves.",
    ["digest"],
    multiprocess_mode="liveall",
)
RELOADS = Counter("llmgw_plan_reloads", "Plan reloads, by result (loaded or refused).", ["result"])


def exposition() -> tuple[bytes, str]:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return generate_latest(_DEFAULT), CONTENT_TYPE_LATEST
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return generate_latest(registry), CONTENT_TYPE_LATEST
