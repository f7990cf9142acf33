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

A key's budget (tokens per calendar day, week or month) is held the same way: the same
admission reserves the request's tokens against the period's spend, and the answer settles
them. A request is admitted only when what it holds fits what is left of the budget. The
spend must outlive the gateway, so it is kept in a second file, in the state directory
(`state_directory`), never the metrics folder `llmgw serve` deletes at exit; so are each
key's usage totals. A worker killed mid-answer leaves its reservation counted: on the safe
side, as the budget is money.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from llmgw.errors import UsageError
from llmgw.gateway.errors import ApiError
from llmgw.gateway.state import metrics
from llmgw.gateway.state.keys import Budget, Tenant, rfc3339

log = logging.getLogger("llmgw.gateway")

WINDOW = 60.0
FILE_NAME = "llmgw-ratelimit.sqlite"
STATE_FILE_NAME = "llmgw-state.sqlite"


def state_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where what must outlive the gateway is kept (budget spend, usage totals):
    LLMGW_STATE_DIR, else $XDG_STATE_HOME/llmgw, else ~/.local/state/llmgw."""
    env = os.environ if environ is None else environ
    if env.get("LLMGW_STATE_DIR"):
        return Path(env["LLMGW_STATE_DIR"])
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw"


@dataclass(frozen=True)
class Spend:
    """A key's budget as one request is admitted: the x-llmgw-budget-* headers' figures,
    and what the request holds of it until it settles."""

    budget: Budget
    used: int  # spent and held in the period, before this request
    period: str  # the period's first instant, as its spend is filed
    reset: dt.datetime  # the next period's first instant
    held: int = 0
    shared: bool = False  # held on Redis (limits_redis.py), not in the state file
    prompt: int = 0  # of what the request holds, its prompt's estimate (the rest: its answer)

    def headers(self) -> dict[str, str]:
        return {
            "x-llmgw-budget-remaining-tokens": str(max(0, self.budget.tokens - self.used)),
            "x-llmgw-budget-reset": rfc3339(self.reset),
        }

    def refuses(self, reserve: int) -> bool:
        """Whether a request holding `reserve` tokens does not fit what is left. Admitting one
        while anything was left let the last request overrun the budget by its own size: a
        1,000-token budget and 300-token answers gave four answers and 1,200 spent."""
        return self.used >= self.budget.tokens or self.used + max(0, reserve) > self.budget.tokens


def read_spend(state: Path, name: str, budget: Budget, now: float) -> Spend:
    """A key's spend this period as a state directory keeps it, read without a gateway (for
    `llmgw keys`); nothing spent when the directory holds no state yet."""
    period, reset = spend_period(budget, now)
    path = state / STATE_FILE_NAME
    used = 0
    if path.is_file():
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            query = "SELECT tokens FROM spent WHERE key = ? AND period = ?"
            row = db.execute(query, (name, period)).fetchone()
            used = int(row[0]) if row else 0
        except sqlite3.OperationalError:  # made by a gateway that has not yet spent anything
            used = 0
        except sqlite3.DatabaseError as exc:
            raise UsageError(
                f"{path} is not a state file llmgw can read ({exc}); move it away (the spend in "
                "it is lost) or point LLMGW_STATE_DIR at the gateway's state directory."
            ) from None
        finally:
            db.close()
    return Spend(budget, used, period, reset)


def spend_period(budget: Budget, now: float) -> tuple[str, dt.datetime]:
    """The key the period's spend is filed under, and when the next period starts."""
    start, end = budget.period(dt.datetime.fromtimestamp(now, dt.UTC))
    return rfc3339(start), end


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
    spend: Spend | None = None  # the key's budget, when it has one

    def headers(self) -> dict[str, str]:
        out = self.spend.headers() if self.spend is not None else {}
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


class Limits(Protocol):
    """What a request's path asks of a key's limits and budget, wherever they are counted:
    `LocalLimiter` (this instance's workers, SQLite) or `SharedLimiter` (every instance, on
    Redis, limits_redis.py). The gateway holds one of them as this."""

    def admit(self, tenant: Tenant, reserve: int = 0, prompt: int = 0) -> Window | None:
        """The key's window with this request counted and `reserve` tokens held (`prompt` of
        them its prompt's); ApiError 429
        when it is over a limit or its budget; None for a key without limits."""
        ...

    def spent(self, tenant: Tenant) -> Spend | None:
        """The key's spend this period, held tokens included; None without a budget."""
        ...

    def used(self, tenant: Tenant) -> tuple[int, int]:
        """Requests and tokens the key used in the last minute."""
        ...

    def count(
        self,
        tenant: Tenant,
        prompt: int,
        completion: int,
        reservation: int | None = None,
        spend: Spend | None = None,
    ) -> None:
        """An ended answer's tokens, in place of its reservation, and added to its key's totals."""
        ...

    def charge(
        self, tenant: Tenant, tokens: int, reservation: int | None = None, spend: Spend | None = None
    ) -> None:
        """Tokens an ended answer used, in place of its reservation (no totals)."""
        ...

    def totals(self, name: str) -> dict[str, int] | None:
        """A key's usage totals, over restarts."""
        ...


class LocalLimiter:
    """Admits or refuses each request of a key with limits; charges its tokens after."""

    def __init__(
        self, directory: Path, state: Path | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = directory / FILE_NAME
        self.clock = clock  # for budget periods: a test moves it past a period's end
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
        self.state_path = (state or directory) / STATE_FILE_NAME
        self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The spend and usage of every key: readable by the gateway alone (SQLite gives its
        # -wal and -shm files the database's mode).
        if not self.state_path.exists():
            os.close(os.open(self.state_path, os.O_WRONLY | os.O_CREAT, 0o600))
        # Attached, so one admission's transaction covers the minute's counts and the spend.
        self.db.execute("ATTACH DATABASE ? AS state", (str(self.state_path),))
        self.db.execute("PRAGMA state.journal_mode=WAL")
        # Survives the process being killed (the WAL is in the OS's hands); a power cut may
        # lose the last moments, which fsync on every answer would cost far more than.
        self.db.execute("PRAGMA state.synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS state.spent (key TEXT NOT NULL, period TEXT NOT NULL, "
            "tokens INTEGER NOT NULL, warned INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, period))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS state.totals (key TEXT PRIMARY KEY, requests INTEGER NOT NULL, "
            "prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL)"
        )

    def admit(self, tenant: Tenant, reserve: int = 0, prompt: int = 0) -> Window | None:
        """The key's window with this request counted, and `reserve` tokens held for it
        until `settle` (`prompt` of them its prompt's, for the 429's advice); ApiError 429
        when it is over a limit or its budget. None for a key without limits, which costs
        nothing here."""
        if tenant.rpm is None and tenant.tpm is None and tenant.budget is None:
            return None
        now = time.time()
        since = now - WINDOW
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            spend = self._spend(tenant.name, tenant.budget) if tenant.budget is not None else None
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
            if spend is not None:
                spend = replace(spend, held=max(0, reserve), prompt=prompt)
            over = self._over(tenant, window) or (
                "budget" if spend is not None and spend.refuses(reserve) else None
            )
            if over is None:
                held = max(0, reserve) if tenant.tpm is not None else 0
                if tenant.rpm is not None or tenant.tpm is not None:
                    row = db.execute("INSERT INTO used VALUES (?, ?, 1, ?)", (tenant.name, now, held))
                    if held:
                        window = replace(window, reservation=row.lastrowid)
                if spend is not None:
                    self._add_spend(tenant.name, spend.period, spend.held)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        window = replace(window, spend=spend)
        return refuse_or_admit(tenant, window, over)

    def _spend(self, name: str, budget: Budget) -> Spend:
        period, reset = spend_period(budget, self.clock())
        row = self.db.execute(
            "SELECT tokens FROM state.spent WHERE key = ? AND period = ?", (name, period)
        ).fetchone()
        return Spend(budget, int(row[0]) if row else 0, period, reset)

    def _add_spend(self, name: str, period: str, tokens: int) -> tuple[int, bool]:
        """Add to a period's spend (less, to settle a reservation); the spend after, and
        whether a warning was already logged this period."""
        tokens_now, warned = self.db.execute(
            "INSERT INTO state.spent (key, period, tokens) VALUES (?, ?, ?) ON CONFLICT (key, period) "
            "DO UPDATE SET tokens = tokens + excluded.tokens RETURNING tokens, warned",
            (name, period, tokens),
        ).fetchone()
        return int(tokens_now), bool(warned)

    def spent(self, tenant: Tenant) -> Spend | None:
        """The key's spend this period (held tokens included); None without a budget."""
        if tenant.budget is None:
            return None
        return self._spend(tenant.name, tenant.budget)

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

    def count(
        self,
        tenant: Tenant,
        prompt: int,
        completion: int,
        reservation: int | None = None,
        spend: Spend | None = None,
    ) -> None:
        """An answer's tokens as it ends: charged to its key in place of what was reserved for
        it, and added to the key's usage totals in the state file (limits_redis.py: over
        every instance)."""
        self._settle(tenant, prompt + completion, reservation, spend, (1, prompt, completion))

    def charge(
        self, tenant: Tenant, tokens: int, reservation: int | None = None, spend: Spend | None = None
    ) -> None:
        """Count the tokens an ended answer used, in place of what was reserved for it."""
        self._settle(tenant, tokens, reservation, spend, (0, 0, 0))

    def _settle(
        self,
        tenant: Tenant,
        tokens: int,
        reservation: int | None,
        spend: Spend | None,
        totals: tuple[int, int, int],
        minute: bool = True,
    ) -> None:
        """Settle in one transaction; `minute` False when the tpm window was counted elsewhere
        (on Redis), and only the budget is settled here."""
        window = minute and tenant.tpm is not None and (tokens > 0 or reservation is not None)
        if not window and spend is None and not any(totals):
            return
        db = self.db
        after: tuple[int, bool] | None = None
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if window and reservation is not None:
                    # Emptied, not deleted: the row still counts the request against rpm.
                    db.execute("UPDATE used SET tokens = 0 WHERE rowid = ?", (reservation,))
                if window and tokens > 0:
                    db.execute("INSERT INTO used VALUES (?, ?, 0, ?)", (tenant.name, time.time(), tokens))
                if spend is not None:
                    # Filed in the period it was admitted in, though it ends in the next.
                    after = self._add_spend(tenant.name, spend.period, max(0, tokens) - spend.held)
                    if self._crossed(spend, *after):
                        db.execute(
                            "UPDATE state.spent SET warned = 1 WHERE key = ? AND period = ?",
                            (tenant.name, spend.period),
                        )
                if any(totals):
                    db.execute(
                        "INSERT INTO state.totals VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                        "requests = requests + excluded.requests, "
                        "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                        "completion_tokens = completion_tokens + excluded.completion_tokens",
                        (tenant.name, *totals),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            # Called as an answer ends: a busy file must not turn a delivered answer into an error.
            log.exception("could not count %d tokens for key '%s'", tokens, tenant.name)
            return
        if spend is not None and after is not None:
            settled(tenant.name, spend, *after)

    @staticmethod
    def _crossed(spend: Spend, used: int, warned: bool) -> bool:
        warn_at = spend.budget.warn_at
        return warn_at is not None and not warned and used >= warn_at * spend.budget.tokens

    def totals(self, name: str) -> dict[str, int] | None:
        """A key's usage totals as the state file keeps them: over restarts."""
        row = self.db.execute(
            "SELECT requests, prompt_tokens, completion_tokens FROM state.totals WHERE key = ?", (name,)
        ).fetchone()
        if row is None:
            return {}
        return {"completion_tokens": row[2], "prompt_tokens": row[1], "requests": row[0]}


def settled(name: str, spend: Spend, used: int, warned: bool) -> None:
    """After a settlement: the key's used fraction for /metrics, and the one warning a period
    when it crossed `warn_at` (`warned`: one was already logged, by any worker)."""
    budget = spend.budget
    metrics.BUDGET_USED.labels(name).set(used / budget.tokens)
    warn_at = budget.warn_at
    if warn_at is None or warned or used < warn_at * budget.tokens:
        return
    log.warning(
        "key '%s' has used %d of its budget of %s (%.0f%%, past warn_at %g); it resets at %s",
        name,
        used,
        budget.describe(),
        100 * used / budget.tokens,
        warn_at,
        rfc3339(spend.reset),
    )


def refuse_or_admit(tenant: Tenant, window: Window, over: str | None) -> Window:
    """The admitted window; the 429 for the limit it is `over`."""
    if window.spend is not None:
        metrics.BUDGET_USED.labels(tenant.name).set(window.spend.used / window.spend.budget.tokens)
    if over is None:
        return window
    metrics.RATE_LIMITED.labels(tenant.name, over).inc()
    if over == "budget" and window.spend is not None:
        raise _over_budget(tenant, window.spend)
    raise _too_many(tenant, window, over)


def _over_budget(tenant: Tenant, spend: Spend) -> ApiError:
    reset = rfc3339(spend.reset)
    wait = max(1, math.ceil((spend.reset - dt.datetime.now(dt.UTC)).total_seconds()))
    left = spend.budget.tokens - spend.used
    if left > 0:
        # Some is left, but not the most this request may take: say what would fit, so the
        # client can ask for a shorter answer now rather than wait for the next period.
        fits = left - spend.prompt
        advice = (
            f"send max_tokens of at most {fits} to fit, or wait until {reset}"
            if fits > 0
            else f"its prompt alone is about {spend.prompt}; wait until {reset}, or ask the gateway's "
            "operator to raise the key's budget in keys.yaml"
        )
        return ApiError(
            429,
            f"Key '{tenant.name}' has {left} tokens left of its budget of {spend.budget.describe()}, "
            f"and this request could take {spend.held} (its prompt and the longest answer it "
            f"allows); {advice}.",
            type="insufficient_quota",
            code="budget_exceeded",
            headers={"Retry-After": str(wait), **spend.headers()},
        )
    return ApiError(
        429,
        f"Key '{tenant.name}' has used its budget of {spend.budget.describe()} "
        f"({spend.used} tokens this {spend.budget.every}); it resets at {reset}. Wait until then, "
        "or ask the gateway's operator to raise the key's budget in keys.yaml.",
        type="insufficient_quota",
        code="budget_exceeded",
        headers={"Retry-After": str(wait), **spend.headers()},
    )


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
