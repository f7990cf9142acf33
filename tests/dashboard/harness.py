"""A stand-in gateway for the dashboard's browser tests, used until `llmgw serve` exists.

It does the three things the dashboard reads and nothing else: serve the plan at
LLMGW_PLAN, reload it when the file changes (refusing an invalid one and keeping
the old), and health-check every replica at `endpoint/health`.

    PYTHONPATH=. python -m uvicorn --factory tests.dashboard.harness:create_app --port P
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import falcon.asgi
import httpx

from llmgw.errors import PlanError
from llmgw.gateway.dashboard import DashboardSnapshot, add_dashboard_routes
from llmgw.plan import read_plan

INTERVAL = float(os.environ.get("LLMGW_HEALTH_INTERVAL", "0.3"))


class _State:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.plan = read_plan(path)
        self.mtime = path.stat().st_mtime_ns
        self.loaded_at = time.time()
        self.refusal: str | None = None
        self.healthy: dict[str, bool] = {}

    def snapshot(self) -> DashboardSnapshot:
        return DashboardSnapshot(self.plan, self.loaded_at, self.refusal, dict(self.healthy))

    def endpoints(self) -> list[str]:
        return [
            r["endpoint"]
            for m in self.plan["models"]
            for p in m["profiles"]
            for r in p["replicas"]
        ]

    def reload_if_changed(self) -> None:
        mtime = self.path.stat().st_mtime_ns
        if mtime == self.mtime:
            return
        self.mtime = mtime
        try:
            plan = read_plan(self.path)
        except PlanError as exc:
            self.refusal = str(exc)
            return
        self.plan, self.loaded_at, self.refusal = plan, time.time(), None

    async def watch(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                self.reload_if_changed()
                checks = [self._check(client, e) for e in self.endpoints()]
                await asyncio.gather(*checks)
                await asyncio.sleep(INTERVAL)

    async def _check(self, client: httpx.AsyncClient, endpoint: str) -> None:
        try:
            ok = (await client.get(endpoint + "/health")).status_code == 200
        except httpx.HTTPError:
            ok = False
        self.healthy[endpoint] = ok


class _Watcher:
    def __init__(self, state: _State) -> None:
        self.state = state
        self.task: asyncio.Task[Any] | None = None

    async def process_startup(self, scope: Any, event: Any) -> None:
        self.task = asyncio.create_task(self.state.watch())

    async def process_shutdown(self, scope: Any, event: Any) -> None:
        if self.task is None:
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def create_app() -> falcon.asgi.App:
    state = _State(Path(os.environ["LLMGW_PLAN"]))
    app = falcon.asgi.App(middleware=[_Watcher(state)])
    add_dashboard_routes(app, state.snapshot)
    return app
