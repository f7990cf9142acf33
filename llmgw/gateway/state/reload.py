"""The served plan and how it changes: at start, when the file is replaced, and on deploy.

Every worker polls the plan file's identity (device, inode, size, mtime) a few times a
second. Deploys write a new file and rename it over the old one, so the identity changes
exactly once per deploy and a worker never sees half a plan. A plan that cannot be read
or does not validate is refused: the old table keeps serving and the refusal is kept, so
/readyz and the dashboard can say why the deploy did not take.

Every plan a worker serves is also kept beside the plan file as `.NAME.last-good`. A
worker that starts while the plan file is bad (gunicorn replaces a worker that died, or
the operator restarts the service after a bad file was copied in) serves that instead:
without it, one bad file and one worker restart took the whole gateway down.

A refusal is also recorded beside the plan file as `.NAME.refused`, and every worker's
watcher reads it: a deploy is checked by the one worker that received it, and before this
record only that worker's /readyz and dashboard said it was refused, so a probe or a person
who happened to reach another worker saw nothing wrong. The record names the plan file it
was made against (its signature), so it lapses by itself once any plan replaces that file;
it is never deleted, since a worker that cleared it on loading could erase a refusal
another worker had just made against the new file.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from pathlib import Path

from llmgw.atomic import Signature, file_signature, replace_file
from llmgw.errors import LlmgwError, PlanError
from llmgw.gateway.state import metrics
from llmgw.gateway.state.routes import RouteTable
from llmgw.plan import Plan, parse_plan, read_plan

log = logging.getLogger("llmgw.gateway")


def last_good_path(plan: Path) -> Path:
    return plan.with_name(f".{plan.name}.last-good")


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def refusal_path(plan: Path) -> Path:
    return plan.with_name(f".{plan.name}.refused")


class PlanWriteError(LlmgwError):
    """The plan was fine; the gateway's disk was not."""


def settle_heap() -> None:
    """Put what this worker keeps for good (its code, its app, the plan it serves) where
    Python's cycle collector no longer walks it; done at start and after each new plan.

    A full collection walks every tracked object, and one ran in each worker during every
    run of bench/streams.py: 44-72 ms with the worker's code and plan in it, 18-22 ms
    without, every open stream waiting meanwhile. Young collections come every 10,000
    allocations rather than 700: a request makes hundreds of objects and nearly all die
    with it, so the default threshold ran the collector every few requests for nothing
    (164 young collections in a streams run; 11 after, and 3% less CPU per request).
    The old plan is unfrozen and collected first, so a deploy frees it.
    """
    gc.set_threshold(10_000, 10, 10)
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def read_table(path: Path, created: int) -> RouteTable:
    """The routes of the plan at `path`; PlanError for anything that keeps it from being served.

    At a worker's start nothing else may escape: gunicorn stops the whole gateway when one
    worker cannot load the app, although a last good plan was there to serve.
    """
    try:
        return RouteTable.from_plan(read_plan(path), created=created)
    except PlanError:
        raise
    except Exception as exc:
        log.exception("reading the plan %s failed", path)
        raise PlanError(
            f"the gateway failed checking {path} ({type(exc).__name__}); its log has the details."
        ) from None


class PlanState:
    """What this worker serves now, and what became of the last attempt to change it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_good = last_good_path(path)
        self.refused = refusal_path(path)
        self._signature: Signature = file_signature(path)
        self._record_signature: Signature = None
        self.refusal: str | None = None
        try:
            self.table = read_table(path, created=self._created())
        except PlanError as exc:
            # A gateway without a plan would answer every request 404: with no last good
            # plan either, refuse to start.
            if not self.last_good.is_file():
                raise
            self.table = read_table(self.last_good, created=self._created())
            self.refusal = f"{exc} Serving the last good plan {self.table.digest} instead."
            metrics.RELOADS.labels("refused").inc()
            log.error("refused the plan file at start: %s", self.refusal)
            self._record_refusal()
        self.loaded_at = time.time()
        self._keep_as_last_good()
        # A worker started after another refused a deploy says so too (gunicorn replaces
        # workers that die; the refused deploy is still the latest word on this file).
        self._read_record()
        # One change at a time: the watcher awaits its read of the file, and a deploy
        # landing on this worker meanwhile would otherwise be overwritten by the older
        # plan the watcher read.
        self._changing = asyncio.Lock()
        metrics.PLAN_INFO.labels(self.table.digest).set(1)
        for endpoint in self.table.replicas:
            metrics.REPLICA_HEALTHY.labels(endpoint).set(1)
        log.info("serving plan %s from %s", self.table.digest, path)

    def _created(self) -> int:
        try:
            return int(os.stat(self.path).st_mtime)
        except OSError:
            return int(time.time())

    async def watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_file()
            except Exception:  # one bad poll must not end reloading for good
                log.exception("checking %s for a new plan failed", self.path)

    async def check_file(self) -> None:
        if file_signature(self.path) != self._signature:
            async with self._changing:
                await self._check_file()
        if file_signature(self.refused) != self._record_signature:
            async with self._changing:
                self._read_record()

    async def _check_file(self) -> None:
        signature = file_signature(self.path)  # again: a deploy may have written it meanwhile
        if signature == self._signature:
            return
        if signature is None:
            self._signature = signature
            self._refuse(f"the plan file {self.path} is gone; still serving {self.table.digest}.")
            return
        try:
            # Validating a large plan takes a while; the event loop keeps serving meanwhile.
            plan = await asyncio.to_thread(read_plan, self.path)
            table = self._table_for(plan, created=self._created())
        except PlanError as exc:
            self._signature = signature
            self._refuse(str(exc))
            return
        except Exception as exc:
            # Recorded like any refusal, so /readyz says the deploy did not take; a bug
            # here must not leave the worker silently on the old plan.
            log.exception("checking %s for a new plan failed", self.path)
            self._signature = signature
            self._refuse(
                f"the gateway failed checking {self.path} ({type(exc).__name__}); its log has the details."
            )
            return
        self._signature = signature
        self._adopt(table)

    async def accept(self, text: bytes) -> str:
        """Check a deployed plan down to its routes, then write it over the plan file and
        serve it. PlanError if it cannot be served; the file is then left as it was, since
        every worker and the next start read it."""
        async with self._changing:
            try:
                # Off the event loop, as the watcher's check is: a 5 MB plan took 2.5 s to
                # check, and every request on this worker waited for it.
                table = await asyncio.to_thread(self._check_deployed, text)
            except PlanError as exc:
                # Recorded as a refused plan file is: whoever watches the dashboard or
                # /readyz is often not the one who ran `llmgw deploy` and saw the 422.
                self._refuse(str(exc))
                raise
            try:
                replace_file(self.path, text, tag="deploy")
            except OSError as exc:
                raise PlanWriteError(
                    f"the gateway cannot write its plan file {self.path}: "
                    f"{exc.strerror or exc}; the operator must make its folder writable."
                ) from None
            self._signature = file_signature(self.path)
            self._adopt(table)
            return self.table.digest

    def _check_deployed(self, text: bytes) -> RouteTable:
        try:
            return self._table_for(parse_plan(text, where="the deployed plan"), created=int(time.time()))
        except PlanError:
            raise
        except Exception as exc:
            # A bug, but the deployer still hears no, and /readyz says why, as for any refusal.
            log.exception("checking a deployed plan failed")
            raise PlanError(
                f"the gateway failed checking the deployed plan ({type(exc).__name__}); its log "
                "has the details."
            ) from None

    def _table_for(self, plan: Plan, created: int) -> RouteTable:
        return RouteTable.from_plan(
            plan, created=created, replicas_before=self.table.replicas, groups_before=self.table.groups
        )

    def _adopt(self, table: RouteTable) -> None:
        old = self.table
        if table.digest == old.digest and self.refusal is None:
            return
        self.table = table
        self.loaded_at = time.time()
        self.refusal = None
        self._keep_as_last_good()
        metrics.RELOADS.labels("loaded").inc()
        if table.digest != old.digest:
            metrics.PLAN_INFO.labels(old.digest).set(0)
        metrics.PLAN_INFO.labels(table.digest).set(1)
        for endpoint, replica in table.replicas.items():
            metrics.REPLICA_HEALTHY.labels(endpoint).set(1 if replica.healthy else 0)
        for endpoint in old.replicas.keys() - table.replicas.keys():
            metrics.REPLICA_HEALTHY.labels(endpoint).set(0)  # /metrics leaves it out
        log.info("reloaded: now serving plan %s (was %s)", table.digest, old.digest)
        del old
        settle_heap()

    def _keep_as_last_good(self) -> None:
        if self.refusal is not None:
            return  # serving the last good plan already
        if file_signature(self.path) != self._signature:
            # The file changed since this worker read it: another worker may already have
            # kept the newer plan, which this older one must not overwrite.
            return
        try:
            # The file's own bytes, not the plan dumped again: with thousands of models,
            # dumping took each worker a second at start. Unchanged since this worker read
            # it (the signature above), so they are the plan it serves.
            text = self.path.read_bytes()
            if _read_or_none(self.last_good) != text:
                replace_file(self.last_good, text, owned=True)
        except OSError as exc:
            log.warning("cannot keep a copy of the plan at %s: %s", self.last_good, exc)

    def _refuse(self, reason: str) -> None:
        self.refusal = reason
        metrics.RELOADS.labels("refused").inc()
        log.error("refused a new plan, still serving %s: %s", self.table.digest, reason)
        self._record_refusal()

    def _record_refusal(self) -> None:
        """Write this worker's refusal where every worker's watcher reads it."""
        record = {"reason": self.refusal, "digest": self.table.digest, "plan_file": self._signature}
        try:
            replace_file(self.refused, json.dumps(record).encode(), tag="refusal", owned=True)
        except OSError as exc:
            log.warning("cannot record the refusal at %s for the other workers: %s", self.refused, exc)
            return
        self._record_signature = file_signature(self.refused)

    def _read_record(self) -> None:
        """Take up a refusal another worker recorded against the plan file this one serves."""
        signature = file_signature(self.refused)
        if signature == self._record_signature:
            return
        self._record_signature = signature
        if signature is None:
            return
        try:
            record = json.loads(self.refused.read_bytes())
            reason, made_against = record["reason"], record["plan_file"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read the refusal recorded at %s: %s", self.refused, exc)
            return
        if not isinstance(reason, str) or not isinstance(made_against, (list, type(None))):
            return
        against = None if made_against is None else tuple(made_against)  # None: the file was gone
        if against != self._signature or self._signature != file_signature(self.path):
            return  # made against a file since replaced: a later plan settled it
        self.refusal = reason
