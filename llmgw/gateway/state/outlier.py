"""Outlier ejection and the retry budget: what real requests say about replicas.

Health checks ask an engine whether it is up; an engine can say 200 to GET /health and
still fail every answer (a wedged CUDA context does that). So, as Envoy does, a replica
that fails `eject_after` real requests in a row leaves rotation for an ejection time,
whatever its health check says. The time doubles each time the same replica is ejected
again (base, 2×base … up to `eject_max`), and when it runs out the replica is on trial:
one request at a time until one succeeds, then full traffic.

Two limits keep this from making things worse:
- No more than half of a model's replicas are ejected at once. When the whole fleet
  fails, the fault is rarely every engine's own; ejecting them all would turn a
  partial outage into 503s for everyone.
- Retries are budgeted (`RetryBudget`): across a worker, retries stay under a share of
  requests plus a small floor, so a sick fleet is not asked everything twice.

Each gunicorn worker keeps its own counts: a worker ejects on what it has seen, and
the budget bounds each worker's retries, so the gateway's retries are bounded by the
same share.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable

from llmgw.gateway.state import metrics
from llmgw.gateway.state.routes import Model, Replica

log = logging.getLogger("llmgw.gateway")


class Outliers:
    def __init__(self, eject_after: int, base: float, most: float) -> None:
        self.eject_after = eject_after
        self.base = base
        self.most = most

    def failed(self, model: Model, replica: Replica, why: str) -> None:
        """A real request failed on `replica` in a way that is the replica's fault."""
        replica.streak += 1
        if replica.ejected_until:
            # Out already; a request it had before then does not count. Its trial request
            # failing sends it straight back out, for longer.
            if replica.on_trial():
                self._eject(replica, f"its trial request failed: {why}")
            return
        if replica.streak < self.eject_after:
            return
        members = _members(model)
        ejected = sum(1 for r in members if r.ejected_until)
        if 2 * (ejected + 1) > len(members):
            log.warning(
                "replica %s failed %d requests in a row (%s) but stays in rotation: ejecting it "
                "would take out more than half of %s's %d replicas",
                replica.endpoint,
                replica.streak,
                why,
                model.name,
                len(members),
            )
            metrics.EJECTIONS_SKIPPED.labels(replica.endpoint).inc()
            return
        self._eject(replica, f"{replica.streak} requests failed in a row; the last: {why}")

    def answered(self, replica: Replica) -> None:
        """A real request got a good first byte from `replica`."""
        replica.streak = 0
        if not replica.ejected_until:
            return
        replica.ejected_until = 0.0
        metrics.REPLICA_EJECTED.labels(replica.endpoint).set(0)
        metrics.EJECTION_RETURNS.labels(replica.endpoint).inc()
        log.info("replica %s passed its trial request: back to full traffic", replica.endpoint)

    def _eject(self, replica: Replica, why: str) -> None:
        seconds = min(self.most, self.base * 2**replica.ejections)
        replica.ejections += 1
        replica.ejected_until = time.monotonic() + seconds
        replica.streak = 0
        metrics.REPLICA_EJECTED.labels(replica.endpoint).set(1)
        metrics.EJECTIONS.labels(replica.endpoint).inc()
        log.warning(
            "replica %s ejected for %gs (ejection %d): %s; it returns on trial, one request first",
            replica.endpoint,
            seconds,
            replica.ejections,
            why,
        )


def _members(model: Model) -> list[Replica]:
    seen: dict[str, Replica] = {}
    for tier in model.tiers:
        for profile in tier:
            seen.update((r.endpoint, r) for r in profile.members())
    return list(seen.values())


class RetryBudget:
    """Retries may be at most `ratio` of the requests of the last `window` seconds, plus
    `floor`: a quiet gateway may still retry its odd failure, a busy one whose replicas
    all fail does not double their load."""

    def __init__(self, ratio: float, floor: int, window: float = 10.0) -> None:
        self.ratio = ratio
        self.floor = floor
        self.window = window
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    def request(self) -> None:
        self._requests.append(time.monotonic())

    def allow(self) -> bool:
        """Take a retry from the budget; False (counted as refused) when it is spent."""
        now = time.monotonic()
        _forget(self._requests, now - self.window)
        _forget(self._retries, now - self.window)
        if len(self._retries) >= self.ratio * len(self._requests) + self.floor:
            metrics.RETRIES.labels("refused").inc()
            return False
        self._retries.append(now)
        metrics.RETRIES.labels("made").inc()
        return True


def _forget(times: deque[float], before: float) -> None:
    while times and times[0] < before:
        times.popleft()


def replica_states(replicas: Iterable[Replica]) -> dict[str, dict[str, object]]:
    """Per replica, what the dashboard and /readyz show about ejection."""
    now = time.monotonic()
    out: dict[str, dict[str, object]] = {}
    for r in replicas:
        state = "in rotation"
        if not r.healthy:
            state = "failing health checks"
        elif r.ejected_until and now < r.ejected_until:
            state = "ejected"
        elif r.ejected_until:
            state = "on trial"
        out[r.endpoint] = {
            "state": state,
            "ejections": r.ejections,
            "failed_in_a_row": r.streak,
            "returns_in": round(max(0.0, r.ejected_until - now), 1) if r.ejected_until else None,
            "inflight": r.inflight,
        }
    return out
