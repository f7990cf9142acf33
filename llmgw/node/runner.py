"""One replica's life on this node: weights, start, health, backoff, and for an on-demand
replica the wait for demand (see the agent's docstring for the states)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llmgw.engines import engine, engine_command, executable_for, replica_fingerprint
from llmgw.errors import LlmgwError
from llmgw.node.credentials import credential_for
from llmgw.node.host import available_gb, port_is_free
from llmgw.node.process import (
    EngineProcess,
    Record,
    cap_log,
    drop_record,
    log_path,
    log_tail,
    save_record,
)
from llmgw.node.weights import WeightsError, downloads, weights_for
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

log = logging.getLogger("llmgw.node")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
# A replica that served this long has earned a fresh start: its next crash waits 1 s again.
BACKOFF_RESET_AFTER_S = 600.0
# An exit this soon after the start is the engine refusing its command line or weights,
# and the message says so with the last lines of its log.
EXITED_AT_ONCE_S = 10.0
# How often a loading engine's health is checked while requests are held for it. Every
# check it waits for is in their first token: at the usual 0.5 s, a 0.8 s load of Gemma
# 3 270M was seen ready at 1.0 s (bench/on_demand.py), a quarter of a second over the
# engine's own load on average, where the goal is 300 ms in all. At 50 ms, each swap still
# waited 25 ms on average for the check after the load; a check costs the engine little.
WAITED_FOR_INTERVAL_S = 0.02


# What a signal that ended an engine usually means, for the person reading /status.
_SIGNAL_HINTS = {
    # A llama.cpp built with -march=native on a virtual machine whose CPU reports AMX the
    # hypervisor does not enable: it loaded its weights, then died at its first prompt.
    signal.SIGILL: "the engine's build uses CPU instructions this machine does not run; "
    "rebuild it for this CPU (for llama.cpp: -DGGML_NATIVE=OFF -DGGML_AVX2=ON)",
    signal.SIGKILL: "often the kernel's out-of-memory killer: see dmesg",
}


def how_it_ended(exit_code: int | None) -> str:
    """An engine's end as a person reads it: its exit code, or the signal and what it
    usually means (a negative code is a signal's number)."""
    if exit_code is None:
        return "unknown code"
    if exit_code >= 0:
        return f"code {exit_code}"
    try:
        sig = signal.Signals(-exit_code)
    except ValueError:
        return f"code {exit_code}"
    hint = _SIGNAL_HINTS.get(sig)
    return f"code {exit_code}, {sig.name}" + (f": {hint}" if hint else "")


class NodeError(LlmgwError):
    pass


@dataclass(frozen=True)
class RunnerSettings:
    node: str
    state_dir: Path
    grace_s: float = 30.0
    log_limit_bytes: int = 10 * 1024 * 1024
    health_interval_s: float = 0.5
    lease_ttl_s: float = 900.0  # a lease its gateway never released lapses after this
    tick_s: float = 1.0  # how often leases and idle times are looked at
    # Each engine gets a credential of its own (node/credentials.py) that the gateway learns
    # with the agent's token: on whenever the agent has a token to tell it with.
    engine_keys: bool = False


@dataclass(frozen=True)
class Want:
    """One replica the plan places on this node."""

    key: str  # model/profile/index: stable across plans while the replica is the same one
    model: PlanModel
    profile: PlanProfile
    replica: PlanReplica
    host: str

    @property
    def port(self) -> int:
        assert self.replica.port is not None
        return self.replica.port

    @property
    def fingerprint(self) -> str:
        return replica_fingerprint(self.model, self.profile, self.replica, self.host)


class Runner:
    """Keeps one replica running, from weights to ready, restarting it after a backoff."""

    def __init__(
        self, want: Want, settings: RunnerSettings, client: httpx.AsyncClient, counters: Counters
    ) -> None:
        self.want = want
        self.settings = settings
        self.client = client
        self.counters = counters
        self.state = "pending"
        self.message = ""
        self.warning = ""
        self.since = time.time()
        self.restarts = 0
        self.last_exit: int | None = None
        self.process: EngineProcess | None = None
        self.log = log_path(settings.state_dir, want.key)
        self.task: asyncio.Task[None] | None = None
        self.starts = 0  # engine processes this agent started for the replica
        self.load_s: float | None = None  # the last start's seconds to ready
        self._launched_at: float | None = None
        # On demand: what keeps it wanted, and what idle time counts from.
        self.leases: dict[str, float] = {}  # lease id → when it lapses (monotonic)
        self.waiters = 0  # acquires waiting for it to be ready
        self.idle_since = time.monotonic()
        self.last_used: float | None = None  # wall clock: the end of its last lease
        self.evictions = 0
        self.idle_stops = 0
        # On demand: a start that failed is not tried again before this (monotonic), and each
        # failure in a row doubles the wait. An engine that exited at once was once started
        # again every 35 ms for two minutes (3,120 starts) while its request waited it out.
        self.credential: str | None = None  # the engine's own key, when it was given one
        self.retry_at = 0.0
        self.failures = 0  # failed starts in a row
        self._changed = asyncio.Event()

    @property
    def on_demand(self) -> bool:
        return self.want.profile.on_demand

    @property
    def active(self) -> bool:
        """Its engine runs, or is on its way up, or waits out a backoff to start again."""
        return self.task is not None and not self.task.done()

    @property
    def wanted(self) -> bool:
        """Someone waits for it or has a request in flight: only then is a crash retried."""
        return self.waiters > 0 or bool(self.leases)

    def start(self, adopted: Record | None) -> None:
        if self.on_demand and adopted is None:
            self._set("idle", "not started yet; it starts on its first request")
            return
        self.idle_since = time.monotonic()  # an adopted engine's idle time starts now
        self.task = asyncio.get_running_loop().create_task(
            self._run(adopted), name=f"replica {self.want.key}"
        )

    def backing_off(self) -> float:
        """Seconds until a failed on-demand engine may be started again; 0 when it may now."""
        return max(0.0, self.retry_at - time.monotonic())

    def wake(self) -> None:
        """Start an on-demand engine for a request; the state is no longer `idle` on return,
        so a caller waiting for `ready` does not mistake the old state for the outcome."""
        self._set("pending")
        self.idle_since = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._run(None), name=f"replica {self.want.key}")

    async def wait_ready(self, timeout_s: float) -> bool:
        """True once it answers its health check; False when it fails first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while self.state != "ready":
            left = deadline - time.monotonic()
            if self.state in ("failed", "backoff", "idle", "stopping", "stopped") or left <= 0:
                return False
            self._changed.clear()
            await wait_at_most(self._changed, left)
        return True

    def _set(self, state: str, message: str = "") -> None:
        if state != self.state or message != self.message:
            self.since = time.time()
            level = logging.WARNING if state in ("failed", "backoff") else logging.INFO
            log.log(
                level,
                "%s %s %s%s",
                self.want.key,
                self.want.replica.endpoint,
                state,
                f": {message}" if message else "",
            )
        if state == "ready":
            self.failures = 0
        if state == "ready" and self.state != "ready" and self._launched_at is not None:
            self.load_s = round(time.monotonic() - self._launched_at, 3)
            self._launched_at = None
            self.idle_since = time.monotonic()  # with no request yet, idle time counts from ready
        moved = (state, message) != (self.state, self.message)
        self.state, self.message = state, message
        self._changed.set()
        if moved:
            self.counters.changed()

    async def _run(self, adopted: Record | None) -> None:
        delay = BACKOFF_FIRST_S
        while True:
            ready_for = await self._attempt(adopted)
            adopted = None
            if self.on_demand and ready_for == 0.0:
                # A failed start: whoever waits for it is told at once (and goes to a fallback
                # or another node), and the next request's start waits out the backoff.
                self._failed_start()
                return
            if self.on_demand and not self.wanted:
                # Retrying an engine nobody asks for would hold its memory for nothing; the
                # next acquire starts it again, and the message says what went wrong.
                self.process = None
                self._set("idle", self.message)
                return
            if ready_for >= BACKOFF_RESET_AFTER_S:
                delay = BACKOFF_FIRST_S
            if self.state != "failed":  # a failure before the start stays "failed" while it waits
                self._set("backoff", self.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)
            self.restarts += 1

    def _failed_start(self) -> None:
        self.process = None
        delay = min(BACKOFF_FIRST_S * 2**self.failures, BACKOFF_MAX_S)
        self.failures += 1
        self.retry_at = time.monotonic() + delay
        # Idle, as an on-demand engine nobody runs is, with why; `backing_off` tells its next
        # caller, at once, that it failed and when it is tried again.
        self._set("idle", self.message or "its engine did not start")

    async def _attempt(self, adopted: Record | None) -> float:
        """One life of the engine; returns how long it was ready."""
        want = self.want
        if adopted is not None:
            self.process = EngineProcess(adopted.pid, adopted.start_time)
            # Started with the key its file holds, if the agent that started it kept one.
            if self.settings.engine_keys:
                self.credential = credential_for(self.settings.state_dir, want.key)[1]
            log.info("%s adopted the running engine (pid %d)", want.key, adopted.pid)
        else:
            process = await self._launch()
            if process is None:
                return 0.0
            self.process = process
        return await self._watch(self.process)

    async def _launch(self) -> EngineProcess | None:
        want = self.want
        self._launched_at = time.monotonic()
        if downloads(want.model):  # a local file was once logged as "downloading"
            self._set("downloading")
        try:
            weights = await asyncio.to_thread(
                weights_for, want.model, self.settings.state_dir / "weights", self.counters.add_download
            )
        except WeightsError as exc:
            self._set("failed", str(exc))
            return None
        executable, why = executable_for(want.profile.engine)
        if executable is None:
            self._set("failed", why)
            return None
        command = engine_command(
            want.model, want.profile, want.replica, weights=weights, host=want.host, executable=executable
        )
        self.credential = None
        if self.settings.engine_keys:
            key_file, self.credential = credential_for(self.settings.state_dir, want.key)
            command = engine(want.profile.engine).with_credential(command, str(key_file), self.credential)
        if not port_is_free(want.host, want.port):
            self._set(
                "failed",
                f"port {want.port} on {want.host} is held by another process; stop it, or give this node "
                "another port range in the fleet file and plan again.",
            )
            return None
        self.warning = self._memory_warning()
        self._set("starting")
        try:
            process = EngineProcess.spawn(command.argv, command.env, self.log)
        except OSError as exc:
            self._set("failed", f"{command.argv[0]} could not be started: {exc.strerror or exc}.")
            return None
        self.starts += 1
        if process.started is not None:
            save_record(
                self.settings.state_dir,
                Record(want.key, process.pid, process.started, command.argv, want.fingerprint),
            )
        return process

    def _memory_warning(self) -> str:
        memory = self.want.profile.memory
        free = available_gb()
        if memory is None or free is None or free >= memory.gb:
            return ""
        warning = (
            f"this node has {free:.1f} GB available and the plan says a replica needs {memory.gb:g} GB: "
            "it may fail to load or push other processes into swap."
        )
        log.warning("%s %s", self.want.key, warning)
        return warning

    async def _watch(self, process: EngineProcess) -> float:
        started = time.monotonic()
        ready_at: float | None = None
        probe = engine(self.want.profile.engine)
        host = f"[{self.want.host}]" if ":" in self.want.host else self.want.host
        url = f"http://{host}:{self.want.port}{probe.health_path}"
        checks = 0
        while process.alive():
            state = await self._health(url, probe.ready)
            if state == "ready" and ready_at is None:
                ready_at = time.monotonic()
            self._set(state)
            checks += 1
            if checks % 20 == 0:
                cap_log(self.log, self.settings.log_limit_bytes)
            await asyncio.sleep(self._check_every(ready_at is not None))
        self.last_exit = process.exit_code
        drop_record(self.settings.state_dir, self.want.key)
        code = how_it_ended(process.exit_code)
        tail = log_tail(self.log)
        ran = time.monotonic() - started
        if ran < EXITED_AT_ONCE_S and ready_at is None:
            self.message = f"the engine exited at once ({code}); its log ends: {tail or '(empty)'}"
        else:
            self.message = f"the engine exited ({code}) after {ran:.0f} s; its log ends: {tail or '(empty)'}"
        log.warning("%s %s", self.want.key, self.message)
        return 0.0 if ready_at is None else time.monotonic() - ready_at

    def _check_every(self, ready: bool) -> float:
        if ready:
            return 2.0
        if self.waiters:
            return min(WAITED_FOR_INTERVAL_S, self.settings.health_interval_s)
        return self.settings.health_interval_s

    async def _health(self, url: str, ready: Callable[[int], bool]) -> str:
        try:
            answer = await self.client.get(url, timeout=2.0)
        except httpx.HTTPError:
            return "starting"
        return "ready" if ready(answer.status_code) else "loading"

    async def stop(self) -> None:
        """Stop the engine because the plan no longer has it (or the agent stops)."""
        await self._halt()
        self._set("stopped")

    async def park(self, message: str) -> None:
        """Stop an idle on-demand engine until it is asked for again."""
        await self._halt(at_once=not self.leases and engine(self.want.profile.engine).killed_when_idle)
        self._set("idle", message)

    async def _halt(self, at_once: bool = False) -> None:
        """SIGTERM to the engine's process group, SIGKILL after the grace period (or at once)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        process = self.process
        if process is not None and process.alive():
            self._set("stopping")
            process.signal(signal.SIGKILL if at_once else signal.SIGTERM)
            if not await asyncio.to_thread(process.wait_gone, self.settings.grace_s):
                log.warning("%s did not stop within %g s; killing it", self.want.key, self.settings.grace_s)
                process.signal(signal.SIGKILL)
                await asyncio.to_thread(process.wait_gone, 10.0)
        drop_record(self.settings.state_dir, self.want.key)
        self.process = None

    def status(self) -> dict[str, Any]:
        want = self.want
        message = "; ".join(m for m in (self.message, self.warning) if m)
        return {
            "model": want.model.name,
            "profile": want.profile.name,
            "endpoint": want.replica.endpoint,
            "port": want.port,
            "state": self.state,
            "pid": self.process.pid
            if self.process is not None and self.state not in ("backoff", "failed", "idle", "stopped")
            else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            "message": message or None,
            "log": str(self.log),
            "start": "on-demand" if self.on_demand else "always",
            # The agent sees an always-on replica's requests no more than the gateway tells it:
            # unknown, which is not zero.
            "in_flight": len(self.leases) if self.on_demand else None,
            "last_used": _utc(self.last_used),
            "starts": self.starts,
            "evictions": self.evictions,
            "idle_stops": self.idle_stops,
            "load_s": self.load_s,
            "fingerprint": want.fingerprint,  # the engine's command as planned (llmgw status)
        }


def _utc(when: float | None) -> str | None:
    return None if when is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


class Counters:
    """What the agent counts across its replicas: bytes downloaded, and changes of state.

    The change count is what a gateway's GET /status?after=N waits on: the gateway polled every
    two seconds, so /v1/models said `loaded` of a model up to 1.5 s after a swap had stopped
    it. Now each state change answers every waiting /status at once."""

    def __init__(self) -> None:
        self.download_bytes = 0
        self.changes = 0
        self._moved = asyncio.Event()

    def add_download(self, n: int) -> None:
        self.download_bytes += n  # from a download thread; an int add is atomic under the GIL

    def changed(self) -> None:
        self.changes += 1
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def wait_past(self, seen: int, wait_s: float) -> None:
        """Return once the change count is past `seen`, or after `wait_s` seconds."""
        if self.changes != seen or wait_s <= 0:
            return
        await wait_at_most(self._moved, wait_s)


async def wait_at_most(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set, or `timeout_s` seconds have passed.

    Not asyncio.wait_for: on Python 3.11 it drops a cancellation that lands as the event is
    set (cpython gh-86296). An acquire whose client had left missed its cancellation that
    way while its engine's health checks set the event every 50 ms, went on waiting out its
    whole wait_s, and the start nobody wanted any more went on loading."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
