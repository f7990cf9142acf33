"""The node agent: keeps this node's replicas of the plan running.

Each replica the plan places here gets a Runner, which walks it through

    downloading → starting → loading → ready        (ready: GET /health answers 200;
         ↑                                          llama-server answers 503 while loading)
         └──── backoff (1, 2, 4 … 60 s) ←── exited / failed

and a new plan is reconciled against the runners: what is new starts, what is gone stops,
what changed (command line or weights) is replaced, and what did not change is not touched.
Nothing a replica does stops the agent: a failure is a state with a sentence.

An on-demand replica (the profile's `start: on-demand`) waits in state `idle` instead, until
the gateway acquires it (llmgw/node/leases.py); it goes back to `idle` when it is stopped
for room or after its idle time, and when it fails while nobody wants it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from llmgw.node.process import (
    EngineProcess,
    Record,
    drop_record,
)
from llmgw.node.runner import Counters, Runner, RunnerSettings, Want
from llmgw.plan import Plan

log = logging.getLogger("llmgw.node")


def wants_for(plan: Plan, node: str) -> dict[str, Want]:
    here = plan.node(node)
    if here is None:
        return {}
    out: dict[str, Want] = {}
    for model in plan.models:
        for profile in model.profiles:
            for index, replica in enumerate(profile.replicas):
                if replica.node == node:
                    key = f"{model.name}/{profile.name}/{index}"
                    out[key] = Want(key, model, profile, replica, here.address)
    return out


def missing_node_message(plan: Plan, node: str, where: str) -> str:
    names = ", ".join(n.name for n in plan.nodes) or "none"
    return (
        f"{where} has no node named {node!r}; its nodes are: {names}. Start the agent with "
        "--node set to this machine's name in the fleet file."
    )


class Agent:
    def __init__(self, settings: RunnerSettings) -> None:
        self.settings = settings
        self.runners: dict[str, Runner] = {}
        self.plan: Plan | None = None
        self.counters = Counters()
        self.client = httpx.AsyncClient(trust_env=False)

    async def apply(self, plan: Plan, adopt: dict[str, Record] | None = None) -> None:
        """Make the running replicas the plan's: start the new, stop the gone, replace the changed."""
        wants = wants_for(plan, self.settings.node)
        if plan.node(self.settings.node) is None:
            log.error(
                "%s",
                missing_node_message(plan, self.settings.node, f"plan {plan.digest}")
                + " Stopping every replica.",
            )
        gone = [
            runner
            for key, runner in self.runners.items()
            if key not in wants or wants[key].fingerprint != runner.want.fingerprint
        ]
        for runner in gone:
            del self.runners[runner.want.key]
        await asyncio.gather(*(runner.stop() for runner in gone))
        adopt = adopt or {}
        for key, record in adopt.items():
            if key not in wants or wants[key].fingerprint != record.fingerprint:
                await self._stop_stray(record)
        for key, want in wants.items():
            if key in self.runners:
                self.runners[key].want = want  # same engine; the plan may differ elsewhere
                continue
            runner = Runner(want, self.settings, self.client, self.counters)
            self.runners[key] = runner
            found = adopt.get(key)
            runner.start(found if found is not None and found.fingerprint == want.fingerprint else None)
        self.plan = plan
        self.counters.changed()  # the replicas /status lists are the new plan's
        log.info("serving plan %s: %d replica(s) on node %s", plan.digest, len(wants), self.settings.node)

    async def _stop_stray(self, record: Record) -> None:
        """An engine a previous agent started that the plan no longer wants (or wants changed)."""
        log.info("%s (pid %d) is not in the plan as it runs; stopping it", record.key, record.pid)
        process = EngineProcess(record.pid, record.start_time)
        process.signal(15)
        if not await asyncio.to_thread(process.wait_gone, self.settings.grace_s):
            process.signal(9)
        drop_record(self.settings.state_dir, record.key)

    async def stop(self) -> None:
        runners = list(self.runners.values())
        self.runners.clear()
        await asyncio.gather(*(runner.stop() for runner in runners))
        await self.client.aclose()

    def credentials(self) -> dict[str, str]:
        """Each running engine's key by its endpoint: for the gateway, which asks with the
        agent's token (node/status.py), never for anyone else."""
        return {r.want.replica.endpoint: r.credential for r in self.runners.values() if r.credential}

    def status(self) -> dict[str, Any]:
        return {
            "node": self.settings.node,
            "plan_digest": self.plan.digest if self.plan else None,
            "changes": self.counters.changes,  # for GET /status?after=N (node/status.py)
            "replicas": [self.runners[key].status() for key in sorted(self.runners)],
        }
