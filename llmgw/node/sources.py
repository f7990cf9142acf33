"""Where the node agent's plan comes from: a file on this machine, or a gateway's /admin/plan."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx

from llmgw.atomic import Signature, file_signature
from llmgw.errors import PlanError
from llmgw.plan import Plan, parse_plan, read_plan

log = logging.getLogger("llmgw.node")


class FilePlan:
    """The plan file, watched as the gateway watches it: a rename over it is a new plan."""

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self.seen: Signature = None

    def first(self) -> Plan:
        self.seen = file_signature(self.path)
        return read_plan(self.path)

    async def next(self, current: Plan) -> Plan:
        while True:
            await asyncio.sleep(self.interval)
            signature = file_signature(self.path)
            if signature is None or signature == self.seen:
                continue
            self.seen = signature
            try:
                plan = await asyncio.to_thread(read_plan, self.path)
            except PlanError as exc:
                log.error("refused the new plan file, still running %s: %s", current.digest, exc)
                continue
            if plan.digest != current.digest:
                return plan


class GatewayPlan:
    """The plan the gateway serves, polled: a deploy to the gateway reaches every node."""

    def __init__(self, url: str, token: str | None, interval: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/admin/plan"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.interval = interval

    def _fetch(self) -> Plan:
        try:
            answer = httpx.get(self.url, headers=self.headers, timeout=30, trust_env=False)
        except httpx.HTTPError as exc:
            raise PlanError(f"cannot reach the gateway at {self.url}: {exc}.") from None
        if answer.status_code in (401, 403):
            raise PlanError(
                f"the gateway refused GET {self.url} ({answer.status_code}): set LLMGW_ADMIN_TOKEN "
                "to the gateway's admin token in the agent's environment."
            )
        if answer.status_code != 200:
            raise PlanError(
                f"the gateway answered GET {self.url} with {answer.status_code}: {answer.text[:200]}"
            )
        return parse_plan(answer.content, where=f"the plan from {self.url}")

    def first(self) -> Plan:
        return self._fetch()

    async def next(self, current: Plan) -> Plan:
        while True:
            await asyncio.sleep(self.interval)
            try:
                plan = await asyncio.to_thread(self._fetch)
            except PlanError as exc:
                log.error("still running %s: %s", current.digest, exc)
                continue
            if plan.digest != current.digest:
                return plan
