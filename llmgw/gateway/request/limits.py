"""Requests and tokens per minute, per key, held across every worker of one gateway.

Workers are separate processes, so per-worker counters would let a key through at N times
its limit. The counts live in one small SQLite file (WAL mode) in the directory the
workers already share for metrics; each admission is one short write transaction, which
serialises the workers' check-and-count, so the limit holds exactly, not roughly.

The window slides: what a key used in the last 60 seconds counts. Requests are counted when
admitted, and so are the tokens they may use (the prompt's estimate and the answer's
maximum), as OpenAI counts them: counted only at the end, twenty requests let in together
all found the key under `tpm` and took it sixteen times over. When the answer ends, the
reservation is settled with what it really used (its `usage`, or an estimate for an answer
cut short), counted at that moment. A request is admitted while its key is under `tpm`, so
one request may take it over by at most its own size.

Several gateway instances behind a load balancer each have their own file, so each
enforces the full limit: N instances let a key through at up to N times it.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw.gateway.errors import ApiError
from llmgw.gateway.state import metrics
from llmgw.gateway.state.keys import Tenant

log = logging.getLogger("llmgw.gateway")

WINDOW = 60.0
FILE_NAME = "llmgw-ratelimit.sqlite"


@dataclass(frozen=True)
class Window:
    """What a key has left in the window as one request is admitted: the x-ratelimit-*
    headers' figures."""

    rpm: int | None
    tpm: int | None
    requests: int  # counted before this one
    tokens: int
    reset_requests: float  # seconds until the oldest counted request leaves the window
    reset_tokens: float
    reservation: int | None = None  # the row holding this request's tokens until it settles

    def headers(self) -> dict[str, str]:
        out = {}
        if self.rpm is not None:
            out["x-ratelimit-limit-requests"] = str(self.rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.rpm - self.requests - 1))
            out["x-ratelimit-reset-requests"] = duration(self.reset_requests)
        if self.tpm is not None:
            out["x-ratelimit-limit-tokens"] = str(self.tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.tpm - self.tokens))
            out["x-ratelimit-reset-tokens"] = duration(self.reset_tokens)
        return out


def duration(seconds: float) -> str:
    """As OpenAI writes its reset headers: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


class Limiter:
    """Admits or refuses each request of a key with limits; charges its tokens after."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        # autocommit off by hand: BEGIN IMMEDIATE takes the write lock before reading, so two
        # workers never both read "39 of 40" and both admit.
        self.db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")  # counts of the last minute: a crash may lose them
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS used (key TEXT NOT NULL, at REAL NOT NULL, "
            "requests INTEGER NOT NULL, tokens INTEGER NOT NULL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS used_key_at ON used (key, at)")

    def admit(self, tenant: Tenant, reserve: int = 0) -> Window | None:
        """The key's window with this request counted, and `reserve` tokens held for it
        until `settle`; ApiError 429 when it is over a limit. None for a key without limits,
        which costs nothing here."""
        if tenant.rpm is None and tenant.tpm is None:
            return None
        now = time.time()
        since = now - WINDOW
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM used WHERE key = ? AND at < ?", (tenant.name, since))
            requests, tokens, first_request, first_tokens = db.execute(
                "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(tokens), 0), "
                "MIN(CASE WHEN requests > 0 THEN at END), MIN(CASE WHEN tokens > 0 THEN at END) "
                "FROM used WHERE key = ?",
                (tenant.name,),
            ).fetchone()
            window = Window(
                tenant.rpm,
                tenant.tpm,
                requests,
                tokens,
                (first_request + WINDOW - now) if first_request else WINDOW,
                (first_tokens + WINDOW - now) if first_tokens else 0.0,
            )
            over = self._over(tenant, window)
            if over is None:
                held = max(0, reserve) if tenant.tpm is not None else 0
                row = db.execute("INSERT INTO used VALUES (?, ?, 1, ?)", (tenant.name, now, held))
                if held:
                    window = replace(window, reservation=row.lastrowid)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if over is not None:
            metrics.RATE_LIMITED.labels(tenant.name, over).inc()
            raise _too_many(tenant, window, over)
        return window

    @staticmethod
    def _over(tenant: Tenant, window: Window) -> str | None:
        if tenant.rpm is not None and window.requests >= tenant.rpm:
            return "requests"
        if tenant.tpm is not None and window.tokens >= tenant.tpm:
            return "tokens"
        return None

    def used(self, tenant: Tenant) -> tuple[int, int]:
        """Requests and tokens the key used in the last minute, as the limits count them."""
        requests, tokens = self.db.execute(
            "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(tokens), 0) FROM used WHERE key = ? AND at >= ?",
            (tenant.name, time.time() - WINDOW),
        ).fetchone()
        return int(requests), int(tokens)

    def count(self, tenant: Tenant, prompt: int, completion: int, reservation: int | None = None) -> None:
        """An answer's tokens as it ends: charged to its key in place of what was reserved for
        it (limits_redis.py also adds them to the key's totals over every instance)."""
        self.charge(tenant, prompt + completion, reservation)

    def charge(self, tenant: Tenant, tokens: int, reservation: int | None = None) -> None:
        """Count the tokens an ended answer used, in place of what was reserved for it."""
        if tenant.tpm is None or (tokens <= 0 and reservation is None):
            return
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if reservation is not None:
                    # Emptied, not deleted: the row still counts the request against rpm.
                    db.execute("UPDATE used SET tokens = 0 WHERE rowid = ?", (reservation,))
                if tokens > 0:
                    db.execute("INSERT INTO used VALUES (?, ?, 0, ?)", (tenant.name, time.time(), tokens))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            # Called as an answer ends: a busy file must not turn a delivered answer into an error.
            log.exception("could not count %d tokens for key '%s'", tokens, tenant.name)


def _too_many(tenant: Tenant, window: Window, limit: str) -> ApiError:
    wait = window.reset_requests if limit == "requests" else window.reset_tokens
    retry = str(max(1, math.ceil(wait)))
    per = f"{tenant.rpm} requests" if limit == "requests" else f"{tenant.tpm} tokens"
    error = ApiError(
        429,
        f"Rate limit reached for key '{tenant.name}': {per} per minute. Retry in {retry}s, "
        "or ask the gateway's operator to raise the key's limit in keys.yaml.",
        type=limit,  # as OpenAI says which limit it was: "requests" or "tokens"
        code="rate_limit_exceeded",
        headers={"Retry-After": retry, **window.headers()},
    )
    return error
