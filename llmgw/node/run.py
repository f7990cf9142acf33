"""`llmgw node`: load the plan, adopt what still runs, serve the status, follow new plans."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Protocol

import uvicorn

from llmgw.errors import UsageError
from llmgw.node.agent import Agent, missing_node_message, wants_for
from llmgw.node.leases import OnDemand
from llmgw.node.process import load_records
from llmgw.node.runner import NodeError, RunnerSettings
from llmgw.node.status import create_status_app
from llmgw.plan import Plan
from llmgw.tokens import token_from

log = logging.getLogger("llmgw.node")


class PlanSource(Protocol):
    def first(self) -> Plan: ...

    async def next(self, current: Plan) -> Plan: ...


class _QuietServer(uvicorn.Server):
    """uvicorn inside the agent's loop: the agent owns SIGTERM and Ctrl-C, since they must stop
    the engines in order before the process goes."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_status(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY)
        # only on connections from a socket that says it is TCP, and with it on, every answer
        # uvicorn wrote as head then body waited out the client's delayed ACK: 44 ms for each
        # call to the agent, twice on the way to every on-demand start.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"--status-bind {address}: cannot listen there ({getattr(exc, 'strerror', None) or exc}). "
            "Another agent may hold it: give this one another HOST:PORT."
        ) from None
    sock.listen(128)
    return sock


def run_node(settings: RunnerSettings, source: PlanSource, status_bind: str) -> None:
    """Runs until SIGTERM or Ctrl-C, then stops every engine of this node and returns."""
    _log_to_stderr()
    plan = source.first()
    if plan.node(settings.node) is None:
        raise NodeError(missing_node_message(plan, settings.node, "the plan"))
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    sock = bind_status(status_bind)
    asyncio.run(_main(settings, source, plan, sock))


async def _main(settings: RunnerSettings, source: PlanSource, plan: Plan, sock: socket.socket) -> None:
    token = token_from(os.environ, "LLMGW_AGENT_TOKEN")
    # With a token to tell them with, engines get keys of their own (node/credentials.py).
    settings = dataclasses.replace(settings, engine_keys=token is not None)
    agent = Agent(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await agent.apply(plan, adopt=load_records(settings.state_dir))
    _warn_without_token(plan, settings.node, token)
    demand = OnDemand(agent)
    tending = loop.create_task(demand.tend())
    app = create_status_app(agent, demand, token)
    server = _QuietServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
    served = loop.create_task(server.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    log.info("node %s: status on http://%s:%d/status", settings.node, host, port)

    async def follow() -> None:
        current = plan
        while True:
            current = await source.next(current)
            await agent.apply(current)

    following = loop.create_task(follow())
    try:
        await stopping.wait()
    finally:
        log.info("stopping: every engine of node %s", settings.node)
        for task in (following, tending):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await agent.stop()
        server.should_exit = True
        await served


def _warn_without_token(plan: Plan, node: str, token: str | None) -> None:
    """Said once at the start, since without the token the gateway's acquires are refused
    and the on-demand models of this node never start."""
    if token or not any(w.profile.on_demand for w in wants_for(plan, node).values()):
        return
    log.warning(
        "the plan has on-demand replicas on node %s and LLMGW_AGENT_TOKEN is not set: the gateway "
        "cannot start them. Set it (the same token in the gateway's environment) and restart the agent.",
        node,
    )


def _log_to_stderr() -> None:
    logger = logging.getLogger("llmgw.node")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s llmgw-node %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
