"""Prometheus metrics, one set per process.

With several gunicorn workers each is its own process, so `llmgw serve` points
PROMETHEUS_MULTIPROC_DIR at a fresh directory (removed when it exits) and /metrics sums
the workers' files; without it (one process, e.g. in a debugger) the default registry
answers.

prometheus_client cannot remove a series from those files, so series about what is no
longer served are left out when /metrics answers instead: a plan digest a worker has moved
on from (its gauge is 0), replicas the plan no longer lists, and models it no longer has.
Kept, they piled up with every reload, and a removed replica looked like one still in
rotation.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client import REGISTRY as _DEFAULT
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class _Pid:
    """This process's id, read once and again after a fork.

    prometheus_client's multiprocess values ask `os.getpid()` on every increment, to notice
    a fork: a system call each time, fifteen of them per proxied request.
    """

    value = os.getpid()

    @classmethod
    def forked(cls) -> None:
        cls.value = os.getpid()

    @classmethod
    def get(cls) -> int:
        return cls.value


os.register_at_fork(after_in_child=_Pid.forked)
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    values.ValueClass = values.MultiProcessValue(process_identifier=_Pid.get)  # type: ignore[no-untyped-call]  # prometheus_client leaves it untyped

_M = TypeVar("_M", bound=MetricWrapperBase)
_CHILDREN: dict[tuple[Any, ...], Any] = {}


def labelled(metric: _M, *values: str) -> _M:
    """`metric.labels(*values)`, kept: prometheus_client checks the names and takes a lock
    on every call, a microsecond each, and a proxied request asks for five or six."""
    key = (metric, *values)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*values)
    return child


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

# `key` is the key's name in keys.yaml ("anonymous" for the plain digest file, "-" when the
# gateway takes no keys), never the key.
REQUESTS = Counter(
    "llmgw_requests", "Requests answered, by model, status and key.", ["model", "status", "key"]
)
TOKENS = Counter(
    "llmgw_tokens",
    "Tokens used, from the engines' usage, by kind (prompt, completion).",
    ["model", "key", "kind"],
)
RATE_LIMITED = Counter(
    "llmgw_rate_limited", "Requests refused 429, by key and the limit (requests, tokens).", ["key", "limit"]
)
# The latest figure any worker saw: the spend is shared (state file or Redis), so the newest
# reading is the truest.
BUDGET_USED = Gauge(
    "llmgw_key_budget_used",
    "The fraction of its budget (keys.yaml) each key has used this period, reservations included.",
    ["key"],
    multiprocess_mode="mostrecent",
)
# Set only with LLMGW_REDIS_URL: 1 while every live worker counts rate limits on Redis, 0
# while any counts on its own instance because Redis did not answer (limits_redis.py).
LIMITS_SHARED = Gauge(
    "llmgw_limits_shared",
    "1 while rate limits are counted on the shared store, 0 while counted per instance.",
    ["store"],
    multiprocess_mode="livemin",
)
LATENCY = Histogram(
    "llmgw_request_duration_seconds", "Time from request to last byte.", ["model"], buckets=_BUCKETS
)
FIRST_BYTE = Histogram(
    "llmgw_time_to_first_byte_seconds",
    "Time from request to the first byte of the upstream's answer.",
    ["model"],
    buckets=_BUCKETS,
)
# A streamed answer's first event comes once the engine has read the prompt and made one
# token: tens of milliseconds for a short prompt, seconds for a long one or a queue. Finer
# than _BUCKETS between 50 ms and 2 s, where a healthy engine's median lies, because the
# dashboard reads medians from these buckets.
_FIRST_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60
)  # fmt: skip
FIRST_TOKEN = Histogram(
    "llmgw_time_to_first_token_seconds",
    "Time from request to the first event of a streamed answer: its first token. "
    "Answers not streamed are not counted (their first byte is their last).",
    ["model"],
    buckets=_FIRST_TOKEN_BUCKETS,
)
HELD = Gauge(
    "llmgw_held_requests",
    "Requests waiting for an on-demand engine to start, per worker.",
    ["model"],
    multiprocess_mode="livesum",
)
LOAD_WAIT = Histogram(
    "llmgw_on_demand_wait_seconds",
    "Time a request to an on-demand model waited for its engine (near 0 when it was running).",
    ["model"],
    buckets=_BUCKETS,
)
# Fair scheduling (gateway/schedule/): what waits for a slot, how long, and the slots in use.
QUEUE_WAITING = Gauge(
    "llmgw_queue_waiting",
    "Requests waiting for a replica's slot, per model and key.",
    ["model", "key"],
    multiprocess_mode="livesum",
)
QUEUE_WAIT = Histogram(
    "llmgw_queue_wait_seconds",
    "Time a request waited for a slot, counted for the requests that found none free.",
    ["model"],
    buckets=_BUCKETS,
)
SLOTS_IN_USE = Gauge(
    "llmgw_replica_slots_in_use",
    "Requests a replica is serving now, over every worker (and instance, on Redis).",
    ["replica"],
    multiprocess_mode="livemostrecent",  # read from the store at each scrape (Scheduler.record)
)
SLOTS = Gauge(
    "llmgw_replica_slots",
    "Requests a replica serves at once (--parallel, --max-num-seqs): the gateway sends no more.",
    ["replica"],
    multiprocess_mode="livemostrecent",
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
REPLICA_EJECTED = Gauge(
    "llmgw_replica_ejected",
    "1 while a replica is ejected for failing real requests (outlier ejection), per worker.",
    ["replica"],
    multiprocess_mode="liveall",
)
EJECTIONS = Counter("llmgw_ejections", "Replicas ejected for failing real requests in a row.", ["replica"])
EJECTION_RETURNS = Counter(
    "llmgw_ejection_returns",
    "Ejected replicas back to full traffic after a successful trial request.",
    ["replica"],
)
EJECTIONS_SKIPPED = Counter(
    "llmgw_ejections_skipped",
    "Ejections not made because more than half of a model's replicas would be out.",
    ["replica"],
)
FALLBACKS = Counter(
    "llmgw_fallbacks",
    "Requests a model could not answer that one of its fallbacks (catalogue `fallbacks`) did.",
    ["model", "fallback"],
)
RETRIES = Counter(
    "llmgw_retries",
    "Requests tried again on another replica (made), or not because the retry budget was spent (refused).",
    ["result"],
)
SPANS_DROPPED = Counter(
    "llmgw_trace_spans_dropped",
    "Trace spans lost: the export queue was full (queue_full) or the collector did not take them "
    "(export_failed).",
    ["reason"],
)
PLAN_INFO = Gauge(
    "llmgw_plan_info",
    "1 for the plan digest a worker serves.",
    ["digest"],
    multiprocess_mode="liveall",
)
PREFIX_ROUTES = Counter(
    "llmgw_prefix_routes",
    "Prefix-routed requests: hit (the prefix's own replica) or spill (it was over the load bound).",
    ["model", "profile", "result"],
)
RELOADS = Counter("llmgw_plan_reloads", "Plan reloads, by result (loaded or refused).", ["result"])


def _registry() -> Collector:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return _DEFAULT
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    # prometheus_client's multiprocess module carries no annotations.
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry


def usage_by_key() -> dict[str, dict[str, float]]:
    """Per key name, summed over the workers: requests, prompt_tokens, completion_tokens."""
    return _usage("key", "-")


def usage_of_key(name: str) -> dict[str, dict[str, float]]:
    """One key's usage per model, summed over the workers: requests, prompt_tokens,
    completion_tokens."""
    return _usage("model", "unknown", key=name)


def _usage(by: str, unlabelled: str, key: str | None = None) -> dict[str, dict[str, float]]:
    usage: dict[str, dict[str, float]] = {}
    for metric in _registry().collect():
        for sample in metric.samples:
            if key is not None and sample.labels.get("key") != key:
                continue
            if sample.name == "llmgw_requests_total":
                field = "requests"
            elif sample.name == "llmgw_tokens_total":
                field = f"{sample.labels.get('kind')}_tokens"
            else:
                continue
            group = usage.setdefault(sample.labels.get(by, unlabelled), {})
            group[field] = group.get(field, 0.0) + sample.value
    return usage


# Per model, the running totals the dashboard's figures are made from: each is a sum over
# the workers and only grows, so two readings a minute apart give that minute's figures.
def model_totals() -> dict[str, dict[str, float]]:
    """Per model: requests, prompt_tokens, completion_tokens, and the cumulative bucket
    counts of latency and time to first token, keyed `latency<=LE` and `ttft<=LE`."""
    totals: dict[str, dict[str, float]] = {}
    for metric in _registry().collect():
        field = _TOTALS.get(metric.name)
        if field is None:
            continue
        for sample in metric.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            if sample.name.endswith("_bucket"):
                name = f"{field}<={sample.labels['le']}"
            elif sample.name == "llmgw_tokens_total":
                name = f"{sample.labels.get('kind')}_tokens"
            elif sample.name == "llmgw_requests_total":
                name = field
            else:
                continue  # _sum, _count, _created
            per_model = totals.setdefault(model, {})
            per_model[name] = per_model.get(name, 0.0) + sample.value
    return totals


_TOTALS = {
    "llmgw_requests": "requests",
    "llmgw_tokens": "tokens",
    "llmgw_request_duration_seconds": "latency",
    "llmgw_time_to_first_token_seconds": "ttft",
}


def exposition(replicas: Collection[str], models: Collection[str] = ()) -> tuple[bytes, str]:
    """The text /metrics answers; `replicas` are the endpoints the served plan lists, and
    `models` its model names."""
    return generate_latest(_Served(_registry(), replicas, models)), CONTENT_TYPE_LATEST


class _Served:
    """A registry's metrics less the series about digests, replicas and models no longer
    served."""

    def __init__(self, registry: Collector, replicas: Collection[str], models: Collection[str]) -> None:
        self.registry = registry
        self.replicas = replicas
        # "unknown": requests refused before a model was known (a bad body, a wrong key).
        self.models = {*models, "unknown"}

    def collect(self) -> Iterable[Metric]:
        for metric in self.registry.collect():
            if metric.name == "llmgw_plan_info":
                metric.samples = [s for s in metric.samples if s.value != 0]
            elif metric.name in ("llmgw_replica_healthy", "llmgw_replica_ejected"):
                metric.samples = [s for s in metric.samples if s.labels.get("replica") in self.replicas]
            elif metric.name in _BY_MODEL:
                metric.samples = [s for s in metric.samples if s.labels.get("model") in self.models]
            yield metric


# Metric families (as collected, without _total) whose series are per model.
_BY_MODEL = frozenset(
    {
        "llmgw_requests",
        "llmgw_tokens",
        "llmgw_request_duration_seconds",
        "llmgw_time_to_first_byte_seconds",
        "llmgw_time_to_first_token_seconds",
        "llmgw_prefix_routes",
    }
)
