"""Gateway settings, read once from the environment when a worker starts.

`llmgw serve` passes the plan path as LLMGW_PLAN; everything else an operator sets. Each
timeout is its own knob because they fail differently: a refused connection is known
in milliseconds, a first token may wait behind a long prompt, and a stalled stream
should be cut long before a generous first-token allowance would notice.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llmgw.errors import UsageError
from llmgw.tokens import token_from


@dataclass(frozen=True)
class Settings:
    plan_path: Path
    connect_timeout: float = 2.0
    first_byte_timeout: float = 120.0
    chunk_timeout: float = 60.0
    health_interval: float = 2.0
    health_failures: int = 3
    # One probe's whole exchange: an engine's /health answers in milliseconds even while it
    # generates, so a second without an answer is a silent replica (docs/faults.md).
    health_timeout: float = 1.0
    # Each call to a node's agent, beyond the wait it is asked for: a vanished agent costs
    # a request this much, once, before another node is asked (request/lease.py).
    agent_timeout: float = 2.0
    reload_interval: float = 0.5
    max_body_bytes: int = 8 * 1024 * 1024
    # How the server itself is run (see gateway/server/worker.py).
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 4096
    api_keys_file: Path | None = None
    keys_file: Path | None = None  # keys.yaml: named keys with models and limits
    admin_token: str | None = None
    metrics_token: str | None = None
    access_log: bool = True
    # Where DNS names that list replicas are looked up: None for the system's resolvers.
    dns_servers: tuple[tuple[str, int], ...] | None = None
    dns_interval: float = 5.0  # the longest an answer is kept, whatever its TTL says
    # Outlier ejection and the retry budget (see gateway/state/outlier.py).
    eject_after: int = 5
    eject_time: float = 30.0
    eject_max_time: float = 600.0
    retry_budget: float = 0.2
    retry_floor: int = 10  # per 10 s window: about one retry a second even when idle
    # An answer is cut off past this many bytes: no engine's honest answer comes near it,
    # and relaying an endless one would tie up a worker and the client's memory.
    max_response_bytes: int = 64 * 1024 * 1024
    # On-demand engines (gateway/request/lease.py): how long a request waits for one to load
    # (how many may wait is the scheduler's: queue_per_key).
    load_timeout: float = 120.0
    # Browser origins allowed to call the API (LLMGW_CORS_ORIGINS): none by default, since
    # a page on any site could otherwise spend a key a browser extension or a user pasted.
    cors_origins: tuple[str, ...] = ()
    # Names this gateway (all its workers) on the requests it sends: one that comes back
    # carrying it was sent by this gateway to itself (see `VIA_HEADER`).
    instance: str = ""
    # Redis (or Valkey) where every instance counts rate limits and usage (limits_redis.py);
    # None: each instance counts in its own SQLite file.
    redis_url: str | None = None
    redis_timeout: float = 0.1  # to connect, and for each answer; then limits are counted locally
    # Fair scheduling (gateway/schedule/): how long a request may wait for a replica's slot,
    # how many one key may have waiting per model, and the order (fair, or fifo to compare).
    queue_wait: float = 60.0
    queue_per_key: int = 100
    scheduler: str = "fair"


# A plan endpoint that points at the gateway itself turned one request into hundreds, each
# worker asking itself again; a request that carries this gateway's own mark is refused.
VIA_HEADER = "llmgw-via"


# Variable -> Settings field, one table per type; the README's table of variables lists the same names.
_FLOATS = {
    "LLMGW_CONNECT_TIMEOUT": "connect_timeout",
    "LLMGW_FIRST_BYTE_TIMEOUT": "first_byte_timeout",
    "LLMGW_CHUNK_TIMEOUT": "chunk_timeout",
    "LLMGW_HEALTH_INTERVAL": "health_interval",
    "LLMGW_HEALTH_TIMEOUT": "health_timeout",
    "LLMGW_AGENT_TIMEOUT": "agent_timeout",
    "LLMGW_RELOAD_INTERVAL": "reload_interval",
    "LLMGW_HEADER_TIMEOUT": "header_timeout",
    "LLMGW_BODY_TIMEOUT": "body_timeout",
    "LLMGW_DNS_INTERVAL": "dns_interval",
    "LLMGW_EJECT_TIME": "eject_time",
    "LLMGW_EJECT_MAX_TIME": "eject_max_time",
    "LLMGW_RETRY_BUDGET": "retry_budget",
    "LLMGW_LOAD_TIMEOUT": "load_timeout",
    "LLMGW_REDIS_TIMEOUT": "redis_timeout",
    "LLMGW_QUEUE_WAIT": "queue_wait",
}
_INTS = {
    "LLMGW_HEALTH_FAILURES": "health_failures",
    "LLMGW_MAX_BODY_BYTES": "max_body_bytes",
    "LLMGW_MAX_HEADER_BYTES": "max_header_bytes",
    "LLMGW_MAX_HEADERS": "max_headers",
    "LLMGW_MAX_CONNECTIONS": "max_connections",
    "LLMGW_EJECT_AFTER": "eject_after",
    "LLMGW_RETRY_FLOOR": "retry_floor",
    "LLMGW_MAX_RESPONSE_BYTES": "max_response_bytes",
    "LLMGW_QUEUE_PER_KEY": "queue_per_key",
}


# Settings llmgw no longer reads, and what took their place: `llmgw serve` says so at start.
RETIRED = {
    "LLMGW_MAX_HELD": (
        "LLMGW_MAX_HELD is no longer read: requests waiting for an on-demand engine to start "
        "wait in their keys' queues, bounded by LLMGW_QUEUE_PER_KEY and LLMGW_QUEUE_WAIT; "
        "remove it from the gateway's environment."
    ),
}


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    plan = env.get("LLMGW_PLAN")
    if not plan:
        raise UsageError(
            "LLMGW_PLAN is not set: start the gateway with `llmgw serve --plan PATH`, "
            "or set LLMGW_PLAN to the plan file `llmgw plan` wrote."
        )
    values: dict[str, object] = {"plan_path": Path(plan), "instance": _instance(env)}
    for name, field in _FLOATS.items():
        if env.get(name):
            values[field] = _number(env, name, float)
    for name, field in _INTS.items():
        if env.get(name):
            values[field] = _number(env, name, int)
    if env.get("LLMGW_API_KEYS_FILE"):
        values["api_keys_file"] = Path(env["LLMGW_API_KEYS_FILE"])
    if env.get("LLMGW_KEYS_FILE"):
        values["keys_file"] = Path(env["LLMGW_KEYS_FILE"])
    # Each also from a file (NAME_FILE), so the token need not sit in an environment `ps e` shows.
    if token_from(env, "LLMGW_ADMIN_TOKEN"):
        values["admin_token"] = token_from(env, "LLMGW_ADMIN_TOKEN")
    if token_from(env, "LLMGW_METRICS_TOKEN"):
        values["metrics_token"] = token_from(env, "LLMGW_METRICS_TOKEN")
    if env.get("LLMGW_DNS_SERVERS"):
        values["dns_servers"] = _servers(env["LLMGW_DNS_SERVERS"])
    if env.get("LLMGW_CORS_ORIGINS"):
        values["cors_origins"] = _origins(env["LLMGW_CORS_ORIGINS"])
    if env.get("LLMGW_REDIS_URL"):
        values["redis_url"] = _redis_url(env["LLMGW_REDIS_URL"])
    if env.get("LLMGW_SCHEDULER"):
        # Looked up (and refused with the names there are) by schedule/policies.py.
        values["scheduler"] = env["LLMGW_SCHEDULER"].strip().lower()
    if env.get("LLMGW_ACCESS_LOG", "").lower() in ("0", "off", "false", "no"):
        values["access_log"] = False
    return Settings(**values)  # type: ignore[arg-type]


def _instance(env: Mapping[str, str]) -> str:
    # The workers of one gateway share only their metrics directory (`llmgw serve` makes a
    # new one per run); a lone process has no one to agree with.
    shared = env.get("PROMETHEUS_MULTIPROC_DIR") or f"pid {os.getpid()} {os.urandom(8).hex()}"
    return hashlib.sha256(f"llmgw gateway {shared}".encode()).hexdigest()[:16]


def _origins(text: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise UsageError(
                f"LLMGW_CORS_ORIGINS={text!r}: {origin!r} is not an origin; list origins as a "
                "browser sends them, e.g. https://app.example.com,http://localhost:3000, or * for any."
            )
    return origins


def _servers(text: str) -> tuple[tuple[str, int], ...]:
    servers = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        if item.startswith("["):  # [IPv6]:PORT
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":") or "53"
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, "53"
        if not _is_address(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(
                f"LLMGW_DNS_SERVERS={text!r}: {item!r} is not ADDRESS or ADDRESS:PORT; "
                "set it to e.g. 10.96.0.10 or 127.0.0.1:5353,127.0.0.2:5353."
            )
        servers.append((host, int(port)))
    return tuple(servers)


def _redis_url(url: str) -> str:
    """The URL, or UsageError saying what is wrong with it; never quoting it, since it may
    hold a password."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise UsageError(
            f"LLMGW_REDIS_URL starts with {parts.scheme + '://' if parts.scheme else 'no scheme'}; "
            "set it to redis://[USER:PASSWORD@]HOST[:PORT][/DB] (rediss:// for TLS, Redis or Valkey)."
        )
    try:
        parts.port  # noqa: B018  # urlsplit checks the port only when it is read
    except ValueError:
        raise UsageError(
            f"LLMGW_REDIS_URL (host '{parts.hostname}') has a port that is not a number from 0 to 65535; "
            "set it to redis://[USER:PASSWORD@]HOST[:PORT][/DB]."
        ) from None
    return url


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _number(env: Mapping[str, str], name: str, kind: type[float] | type[int]) -> float | int:
    example = "e.g. 2 or 0.5 (seconds)" if kind is float else "a whole number, e.g. 3"
    try:
        value = kind(env[name])
    except ValueError:
        raise UsageError(f"{name}={env[name]!r} is not a number; set it to {example}.") from None
    # float() also takes "nan" and "inf": a timeout of either never fires, or fails later.
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name}={env[name]!r} must be a number greater than zero; set it to {example}.")
    return value
