"""GET /status (JSON) and GET /metrics (Prometheus) of a running agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import falcon
import falcon.asgi
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.node.agent import Agent

STATES = (
    "pending",
    "downloading",
    "starting",
    "loading",
    "ready",
    "backoff",
    "failed",
    "stopping",
    "stopped",
)


class _AgentCollector(Collector):
    """Read at scrape time, so a replica the plan dropped leaves no stale series behind."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        labels = ["model", "profile", "endpoint", "state"]
        state = GaugeMetricFamily(
            "llmgw_node_replica_state", "1 for the state each replica is in.", labels=labels
        )
        restarts = CounterMetricFamily(
            "llmgw_node_replica_restarts", "Engine restarts after an exit or failure.", labels=labels[:3]
        )
        for runner in self.agent.runners.values():
            want = runner.want
            base = [want.model.name, want.profile.name, want.replica.endpoint]
            for name in STATES:
                state.add_metric([*base, name], 1.0 if runner.state == name else 0.0)
            restarts.add_metric(base, runner.restarts)
        yield state
        yield restarts
        yield CounterMetricFamily(
            "llmgw_node_download_bytes",
            "Weight bytes downloaded by this agent.",
            value=self.agent.counters.download_bytes,
        )


class _Status:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps(self.agent.status(), indent=2).encode()


class _Metrics:
    def __init__(self, agent: Agent) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_AgentCollector(agent))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.data = generate_latest(self.registry)


def create_status_app(agent: Agent) -> falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]:
    app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response] = falcon.asgi.App()
    app.add_route("/status", _Status(agent))
    app.add_route("/metrics", _Metrics(agent))
    return app
