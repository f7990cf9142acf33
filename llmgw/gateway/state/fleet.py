"""What the node agents run, judged against the plan served, for the dashboard: the same two
words per model as `llmgw status` (llmgw/status.py), Synced or OutOfSync and a health."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import httpx

from llmgw.gateway.state.reload import PlanState
from llmgw.status import FleetStatus, agent_urls, ask_agents, judge

log = logging.getLogger("llmgw.gateway")


class FleetWatch:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.last: FleetStatus | None = None

    async def watch(self, state: PlanState, interval: float) -> None:
        """Ask every node's agent each `interval` seconds. A plan for Kubernetes has no agents:
        its workloads are judged by the cluster's own tools."""
        while True:
            plan = state.table.plan
            if plan.target is None and plan.nodes:
                try:
                    reports = await ask_agents(agent_urls(plan), timeout_s=2.0, client=self.client)
                    self.last = judge(plan, reports)
                except Exception:  # noqa: BLE001 - the dashboard's words wait; serving goes on
                    log.exception("could not judge the fleet against plan %s", plan.digest)
            else:
                self.last = None
            await asyncio.sleep(interval)

    def words(self, digest: str) -> Mapping[str, tuple[str, str]]:
        """Model → (sync, health), when the last judgement was of this plan."""
        if self.last is None or self.last.digest != digest:
            return {}
        return {m.name: (m.sync, m.health) for m in self.last.models}
