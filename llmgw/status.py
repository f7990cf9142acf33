"""Is the fleet what the plan says? Two words per model, as Argo CD and Flux judge a deploy.

Sync: the node agents run exactly the replicas the plan places on them (the same model, the
same engine command, the same count). A stopped on-demand replica is in sync: its agent keeps
it, idle, until a request wants it.

Health, from the states the agents report (llmgw/node/agent.py):

    Healthy      ready
    Suspended    on demand and not loaded (idle, or being stopped for room or idleness)
    Progressing  on its way: waiting, downloading, starting, loading
    Degraded     failing or restarting (backoff, failed), or an always-on engine stopped
    Missing      its agent does not answer, or does not run it

A model's health is its worst replica's, except that a model with a replica serving is
Healthy while its other on-demand replicas sleep. The plan is judged as a whole by `ok`:
every model Synced, and Healthy or Suspended.

Only what the agents say is read here; asking them is `ask_agents`, and the table and the
JSON are the reporters' (llmgw/gitops/report/fleet_status.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from llmgw.engines import replica_fingerprint
from llmgw.plan import Plan

SYNCED, OUT_OF_SYNC = "Synced", "OutOfSync"
HEALTHY, SUSPENDED, PROGRESSING, MISSING, DEGRADED = (
    "Healthy",
    "Suspended",
    "Progressing",
    "Missing",
    "Degraded",
)
# Worst last: a model shows its worst replica's word.
_RANK = {HEALTHY: 0, SUSPENDED: 1, PROGRESSING: 2, MISSING: 3, DEGRADED: 4}
# The agent's port when the fleet names none (the fleet schema's agent_port default).
DEFAULT_AGENT_PORT = 9100

_STATE_HEALTH = {
    "ready": HEALTHY,
    "idle": SUSPENDED,
    "pending": PROGRESSING,
    "downloading": PROGRESSING,
    "starting": PROGRESSING,
    "loading": PROGRESSING,
    "backoff": DEGRADED,
    "failed": DEGRADED,
}


@dataclass(frozen=True)
class AgentReport:
    """What one node's agent said, or why it said nothing."""

    node: str
    url: str
    replicas: tuple[Mapping[str, Any], ...] | None  # None: it did not answer
    error: str | None = None
    plan_digest: str | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    model: str
    node: str
    profile: str
    endpoint: str
    sync: str
    health: str
    state: str | None = None  # None: no agent reports it
    message: str | None = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "node": self.node,
            "profile": self.profile,
            "endpoint": self.endpoint,
            "sync": self.sync,
            "health": self.health,
        }
        if self.state is not None:
            doc["state"] = self.state
        if self.message is not None:
            doc["message"] = self.message
        return doc


@dataclass(frozen=True)
class ModelStatus:
    name: str
    sync: str
    health: str
    replicas: tuple[ReplicaStatus, ...]

    @property
    def ok(self) -> bool:
        return self.sync == SYNCED and self.health in (HEALTHY, SUSPENDED)

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sync": self.sync,
            "health": self.health,
            "replicas": [r.document() for r in self.replicas],
        }


@dataclass(frozen=True)
class FleetStatus:
    digest: str
    models: tuple[ModelStatus, ...]
    agents: tuple[AgentReport, ...]

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.models)

    def document(self) -> dict[str, Any]:
        return {
            "plan": self.digest,
            "ok": self.ok,
            "models": [m.document() for m in self.models],
            "nodes": [_agent_document(a) for a in self.agents],
        }


def _agent_document(agent: AgentReport) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": agent.node, "agent": agent.url, "answered": agent.replicas is not None}
    if agent.plan_digest is not None:
        doc["plan"] = agent.plan_digest
    if agent.error is not None:
        doc["error"] = agent.error
    return doc


def agent_urls(plan: Plan, ports: Mapping[str, int] | None = None) -> dict[str, str]:
    """Where each node's agent listens: the port the fleet gives (`ports`, by node name), else
    where the plan says (it records the agent of nodes with on-demand replicas), else the
    default port on the node's address."""
    ports = ports or {}
    urls = {}
    for node in plan.nodes:
        if node.name in ports:
            urls[node.name] = f"http://{node.address}:{ports[node.name]}"
        else:
            urls[node.name] = node.agent or f"http://{node.address}:{DEFAULT_AGENT_PORT}"
    return urls


async def ask_agents(
    urls: Mapping[str, str], timeout_s: float = 5.0, client: httpx.AsyncClient | None = None
) -> dict[str, AgentReport]:
    """Every agent's GET /status at once, by node name; one that does not answer is a report
    with its reason, never an exception."""
    own = client is None
    client = client or httpx.AsyncClient(trust_env=False)
    try:
        answers = await asyncio.gather(*(_ask(client, node, url, timeout_s) for node, url in urls.items()))
    finally:
        if own:
            await client.aclose()
    return {a.node: a for a in answers}


# An agent's status is a few kilobytes a replica; past this it is not an agent answering.
# A 400 MB answer once took `llmgw status` to 856 MB.
MAX_STATUS_BYTES = 8 << 20


async def _ask(client: httpx.AsyncClient, node: str, url: str, timeout_s: float) -> AgentReport:
    where = url.rstrip("/") + "/status"
    try:
        # The whole exchange within the timeout: an agent sending a byte every 2 s kept a
        # read timeout of 5 s waiting past 45 s.
        async with asyncio.timeout(timeout_s):
            body = await _read_bounded(client, where, timeout_s)
        doc = json.loads(body)
        replicas = tuple(r for r in doc["replicas"] if isinstance(r, dict))
    except TimeoutError:
        return AgentReport(
            node, url, None, f"the agent at {where} does not answer (no whole answer in {timeout_s:g} s)"
        )
    except httpx.HTTPError as exc:
        return AgentReport(node, url, None, f"the agent at {where} does not answer ({_reason(exc)})")
    except _TooLarge:
        return AgentReport(
            node, url, None, f"{where} answered more than {MAX_STATUS_BYTES >> 20} MB: not an agent's status"
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return AgentReport(node, url, None, f"{where} did not answer with an agent's status")
    digest = doc.get("plan_digest")
    return AgentReport(node, url, replicas, plan_digest=digest if isinstance(digest, str) else None)


class _TooLarge(Exception):
    pass


async def _read_bounded(client: httpx.AsyncClient, where: str, timeout_s: float) -> bytes:
    async with client.stream("GET", where, timeout=timeout_s) as answer:
        answer.raise_for_status()
        parts, total = [], 0
        async for part in answer.aiter_bytes():
            total += len(part)
            if total > MAX_STATUS_BYTES:
                raise _TooLarge
            parts.append(part)
    return b"".join(parts)


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return str(exc) or type(exc).__name__


def judge(plan: Plan, reports: Mapping[str, AgentReport]) -> FleetStatus:
    """The plan against what the agents report, per model."""
    hosts = {n.name: n.address for n in plan.nodes}
    planned: dict[tuple[str, str, str], tuple[str, str, bool]] = {}  # (model, profile, endpoint)
    order: list[str] = []
    for model in plan.models:
        for profile in model.profiles:
            for replica in profile.replicas:
                if replica.node is None or replica.node not in hosts or replica.port is None:
                    continue  # external, or a workload Kubernetes places: no agent runs it
                fingerprint = replica_fingerprint(model, profile, replica, hosts[replica.node])
                planned[(model.name, profile.name, replica.endpoint)] = (
                    replica.node,
                    fingerprint,
                    profile.on_demand,
                )
                if model.name not in order:
                    order.append(model.name)
    replicas: dict[str, list[ReplicaStatus]] = {name: [] for name in order}
    running: set[tuple[str, str, str]] = set()
    for report in reports.values():
        for seen in report.replicas or ():
            key = (str(seen.get("model")), str(seen.get("profile")), str(seen.get("endpoint")))
            running.add(key)
            replicas.setdefault(key[0], []).append(_running(report.node, key, seen, planned.get(key)))
    for key, (node, _, _) in planned.items():
        if key in running:
            continue
        heard = reports.get(node)
        why = heard.error if heard is not None and heard.error else f"the agent on {node} does not run it"
        missing = ReplicaStatus(key[0], node, key[1], key[2], OUT_OF_SYNC, MISSING, message=why)
        replicas[key[0]].append(missing)
    models = tuple(_model(name, tuple(found)) for name, found in replicas.items())
    agents = tuple(reports[n] for n in sorted(reports))
    return FleetStatus(plan.digest, models, agents)


def _running(
    node: str, key: tuple[str, str, str], seen: Mapping[str, Any], plan: tuple[str, str, bool] | None
) -> ReplicaStatus:
    state = str(seen.get("state"))
    on_demand = seen.get("start") == "on-demand"
    health = _STATE_HEALTH.get(state) or (SUSPENDED if on_demand else DEGRADED)
    message = seen.get("message") if isinstance(seen.get("message"), str) else None
    if plan is None:
        said = f"; {message}" if message else ""
        sync, message = OUT_OF_SYNC, f"the plan does not place it on {node}{said}"
    elif plan[0] != node:
        sync, message = OUT_OF_SYNC, f"the plan places it on {plan[0]}, not {node}"
    elif seen.get("fingerprint") not in (None, plan[1]):
        # The agent replaces an engine whose command changed as soon as it reads the plan.
        sync, message = OUT_OF_SYNC, "it runs another engine command than the plan gives"
    else:
        sync = SYNCED
    return ReplicaStatus(key[0], node, key[1], key[2], sync, health, state, message)


def _model(name: str, replicas: tuple[ReplicaStatus, ...]) -> ModelStatus:
    sync = SYNCED if all(r.sync == SYNCED for r in replicas) else OUT_OF_SYNC
    words = {r.health for r in replicas}
    if words <= {HEALTHY, SUSPENDED}:
        health = HEALTHY if HEALTHY in words else SUSPENDED
    else:
        health = max(words, key=_RANK.__getitem__)
    order = sorted(replicas, key=lambda r: (r.profile, r.endpoint, r.node))
    return ModelStatus(name, sync, health, tuple(order))


def fleet_status(plan: Plan, urls: Mapping[str, str], timeout_s: float = 5.0) -> FleetStatus:
    return judge(plan, asyncio.run(ask_agents(urls, timeout_s)))


def wait_for_fleet(
    plan: Plan,
    urls: Mapping[str, str],
    wait_s: float,
    every_s: float = 2.0,
    heard: Callable[[FleetStatus], None] | None = None,
) -> FleetStatus:
    """Ask until the fleet is what the plan says or `wait_s` has passed, like `argocd app
    wait`; the last answer either way. `heard` sees each answer that differs from the last."""
    deadline = time.monotonic() + wait_s
    last: FleetStatus | None = None
    while True:
        status = fleet_status(plan, urls, timeout_s=min(5.0, max(1.0, wait_s)))
        if heard is not None and (last is None or _words(last) != _words(status)):
            heard(status)
        last = status
        left = deadline - time.monotonic()
        if status.ok or left <= 0:
            return status
        time.sleep(min(every_s, left))


def _words(status: FleetStatus) -> list[tuple[str, str, str]]:
    return [(m.name, m.sync, m.health) for m in status.models]
