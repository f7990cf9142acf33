"""Requests and tokens per minute, per key, held across every instance of the gateway: on
Redis (or Valkey), when LLMGW_REDIS_URL names one.

One SQLite file per instance (limits.py) lets a key through at N times its limit behind a
load balancer over N instances. Here every worker of every instance counts in one place,
and each check-and-count is one Lua script run on the server, so two instances admitting at
once cannot both take the last unit. The scripts read the clock with `redis.call('TIME')`:
the instances' own clocks may disagree by more than a request's worth.

A limits store must not take the fleet down. Each call waits at most TIMEOUT (or
LLMGW_REDIS_TIMEOUT) to connect and as long for an answer; past either, or on any error,
this worker counts in its instance's SQLite file (the parent class) and says so
(`status()`, /readyz, the dashboard, the gauge llmgw_limits_shared), and tries Redis again
RETRY_EVERY seconds later, not at every request. A reply of the wrong shape (a server that
speaks the protocol but is not Redis, or a proxy in the way) is Redis being unavailable too:
an integer for EVALSHA once made every rate-limited request a 500, and `+OK` for HELLO
stopped the gateway at start with a traceback.

Usage totals per key (what /admin/keys and the dashboard show) are one hash per key,
HINCRBY'd as each answer ends, so they are summed over every instance.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from llmgw.errors import UsageError
from llmgw.gateway.request.limits import (
    WINDOW,
    LocalLimiter,
    Spend,
    Window,
    refuse_or_admit,
    settled,
    spend_period,
)
from llmgw.gateway.state import metrics
from llmgw.gateway.state.keys import Budget, Tenant

log = logging.getLogger("llmgw.gateway")

# Loopback answers in a tenth of a millisecond and a datacentre network in about one; a
# Redis that has not answered in 100 ms is down or drowning, and every request would pay it.
# (50 ms was tried: on a busy 2-core machine a healthy Redis missed it now and then, and each
# miss let a key through at N times its limit for the next RETRY_EVERY seconds.)
TIMEOUT = 0.1
RETRY_EVERY = 3.0
PREFIX = "llmgw:"

# KEYS: requests zset, tokens zset, tokens total, reservations hash, reservation sequence,
# the budget period's hash (`tokens` spent and held, `warned`).
# ARGV: rpm, tpm (-1: none), window, member, tokens to reserve (0: none), budget (-1: none),
# tokens to hold of it, when the period's hash may go (a day after the period ends).
# Each token charge is a member "TOKENS:TIME:ID" scored by its time; the running total is
# kept beside it so an admission sums nothing, and what leaves the window is subtracted. A
# reservation is such a member too, found again by its number in the reservations hash.
_ADMIT = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local since = '(' .. string.format('%.6f', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', since)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', since)
if #gone > 0 then
  local sub = 0
  for _, m in ipairs(gone) do sub = sub + tonumber(string.match(m, '^(%d+):')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', since)
  if redis.call('DECRBY', KEYS[3], sub) <= 0 then redis.call('DEL', KEYS[3]) end
end
local requests = redis.call('ZCARD', KEYS[1])
local tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
local first_request = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ''
local first_tokens = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2] or ''
local over = ''
if rpm >= 0 and requests >= rpm then over = 'requests'
elseif tpm >= 0 and tokens >= tpm then over = 'tokens' end
local budget, spent = tonumber(ARGV[6]), 0
if budget >= 0 then
  spent = tonumber(redis.call('HGET', KEYS[6], 'tokens') or '0')
  if over == '' and (spent >= budget or spent + tonumber(ARGV[7]) > budget) then over = 'budget' end
end
local reservation = 0
if over == '' then
  if budget >= 0 and tonumber(ARGV[7]) > 0 then
    redis.call('HINCRBY', KEYS[6], 'tokens', ARGV[7])
    redis.call('EXPIREAT', KEYS[6], ARGV[8])
  end
  local stamp = string.format('%.6f', now)
  local ttl = math.ceil(window) + 1
  redis.call('ZADD', KEYS[1], now, stamp .. ':' .. ARGV[4])
  redis.call('EXPIRE', KEYS[1], ttl)
  local reserve = tonumber(ARGV[5])
  if reserve > 0 then
    reservation = redis.call('INCR', KEYS[5])
    local member = ARGV[5] .. ':' .. stamp .. ':r' .. reservation
    redis.call('ZADD', KEYS[2], now, member)
    redis.call('INCRBY', KEYS[3], reserve)
    redis.call('HSET', KEYS[4], reservation, member)
    for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
  end
end
return {requests, tokens, tostring(first_request), tostring(first_tokens), string.format('%.6f', now), over,
        reservation, spent}
"""

# KEYS: the budget period's hash. ARGV: tokens to add (less than none: a reservation given
# back), the spend past which to warn (-1: never), when the hash may go. The first worker to
# see the spend past it sets `warned`, so one warning is logged a period over every instance.
_SPEND = """
local used = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[1])
redis.call('EXPIREAT', KEYS[1], ARGV[3])
local warned = 1
if tonumber(ARGV[2]) >= 0 and used >= tonumber(ARGV[2]) then
  warned = 1 - redis.call('HSETNX', KEYS[1], 'warned', 1)
end
return {used, warned}
"""

# KEYS: tokens zset, tokens total, usage hash, reservations hash. ARGV: tokens to charge
# (0: the key has no tpm), window, member, requests, prompt, completion (to add to the key's
# totals), the reservation this settles (0: none). The reservation leaves the window as the
# tokens really used enter it, in one step: no admission sees both, or neither.
_COUNT = """
if redis.replicate_commands then redis.replicate_commands() end
local charge, window = tonumber(ARGV[1]), tonumber(ARGV[2])
if ARGV[7] ~= '0' then
  local member = redis.call('HGET', KEYS[4], ARGV[7])
  if member then
    redis.call('HDEL', KEYS[4], ARGV[7])
    -- Gone already if it left the window, and with it from the total.
    if redis.call('ZREM', KEYS[1], member) == 1 then
      local held = tonumber(string.match(member, '^(%d+):'))
      if redis.call('DECRBY', KEYS[2], held) <= 0 then redis.call('DEL', KEYS[2]) end
    end
  end
end
if charge > 0 then
  local t = redis.call('TIME')
  local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
  redis.call('ZADD', KEYS[1], now, ARGV[1] .. ':' .. now .. ':' .. ARGV[3])
  redis.call('INCRBY', KEYS[2], charge)
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
  redis.call('EXPIRE', KEYS[2], math.ceil(window) + 1)
end
local fields = {'requests', 'prompt_tokens', 'completion_tokens'}
for i = 1, 3 do
  if tonumber(ARGV[3 + i]) > 0 then redis.call('HINCRBY', KEYS[3], fields[i], ARGV[3 + i]) end
end
return 1
"""

# KEYS: requests zset, tokens total. ARGV: window.
_USED = """
local t = redis.call('TIME')
local since = '(' .. string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[1]))
return {redis.call('ZCOUNT', KEYS[1], since, '+inf'), tonumber(redis.call('GET', KEYS[2]) or '0')}
"""

_T = TypeVar("_T")

# What redis-py and the unpacking of an answer raise for a reply of the wrong shape.
WRONG_SHAPE = (AttributeError, TypeError, ValueError, IndexError, KeyError, UnicodeError)


@dataclass(frozen=True)
class LimitsStatus:
    """Where this worker counts right now: /readyz's `limits` block."""

    store: str  # "redis" or "sqlite"
    shared: bool
    reason: str | None = None  # why it counts locally, while it does

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"store": self.store, "state": "shared" if self.shared else "degraded"}
        if self.reason:
            doc["reason"] = self.reason
        return doc


def where(url: str) -> str:
    """The URL as logs and /readyz may show it: scheme, host, port and database, never the
    user or password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path if parts.path not in ('', '/') else ''}"


def client(url: str, timeout: float = TIMEOUT) -> redis.Redis:
    # No retries in the client: redis-py 6+ retries three times with backoff by default,
    # which would turn a bounded 100 ms wait into seconds. Coming back is RETRY_EVERY's job.
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        decode_responses=True,
    )


def check_redis(url: str, timeout: float = 2.0) -> str | None:
    """At `llmgw serve`'s start: UsageError for what only the operator can fix (an unknown
    host, a wrong password or user, a URL that is no Redis); a warning to print for a Redis
    that is only down or slow now, which the workers ride out; None when it answers."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        try:
            socket.getaddrinfo(parts.hostname or "localhost", parts.port or 6379, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise UsageError(
                f"LLMGW_REDIS_URL names host '{parts.hostname}', which does not resolve ({exc.strerror}); "
                "correct the host name, or unset LLMGW_REDIS_URL to count limits per instance."
            ) from None
    conn = client(url, timeout)
    try:
        conn.ping()
        # An ACL user may PING and yet not run scripts: found here, not as every worker
        # counting on its own.
        conn.script_load(_ADMIT)
    except redis.AuthenticationError as exc:
        raise UsageError(
            f"Redis at {where(url)} refused the password or user in LLMGW_REDIS_URL ({exc}); "
            "correct it (redis://USER:PASSWORD@HOST:PORT), or unset LLMGW_REDIS_URL."
        ) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return (
            f"Redis at {where(url)} does not answer now ({exc}); each instance counts rate limits "
            "on its own until it does."
        )
    except WRONG_SHAPE as exc:
        return (
            f"the server at {where(url)} answers in a shape Redis does not ({type(exc).__name__}); "
            "each instance counts rate limits on its own until it answers as Redis. Check that "
            "LLMGW_REDIS_URL names a Redis or Valkey."
        )
    except redis.ResponseError as exc:
        # AUTH sent to a Redis without a password, or an ACL user without PING or scripts.
        raise UsageError(
            f"Redis at {where(url)} refused the gateway ({exc}); correct LLMGW_REDIS_URL's user "
            "and password, or let that user run PING, EVALSHA and SCRIPT LOAD on keys llmgw:*."
        ) from None
    finally:
        conn.close()
    return None


class SharedLimiter(LocalLimiter):
    """The LocalLimiter's interface, counted on Redis; the parent's SQLite file while Redis is away."""

    def __init__(
        self,
        url: str,
        directory: Path,
        timeout: float = TIMEOUT,
        retry_every: float = RETRY_EVERY,
        state: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(directory, state, clock)
        self.url = url
        self.redis = client(url, timeout)
        self.retry_every = retry_every
        self._admit = self.redis.register_script(_ADMIT)
        self._count = self.redis.register_script(_COUNT)
        self._used = self.redis.register_script(_USED)
        self._spent = self.redis.register_script(_SPEND)
        self.down: str | None = None  # why this worker counts locally, while it does
        self.retry_at = 0.0
        self.heard_at = 0.0  # when Redis last answered this worker
        metrics.LIMITS_SHARED.labels("redis").set(1)
        # Connected and the scripts loaded before the first request, not during it.
        self._shared(self._load)

    def _load(self) -> None:
        for script in (self._admit, self._count, self._used, self._spent):
            self.redis.script_load(script.script)
        # And one read through a script, as status() checks: a server that takes SCRIPT LOAD
        # but answers EVALSHA in another shape had a new worker say "shared" on /readyz
        # until its first keyed request (a flaky test_shared_limits in CI).
        self._read_check()

    def _read_check(self) -> None:
        keys = _keys("-")
        _pair(self._used(keys=[keys[0], keys[2]], args=[WINDOW]))

    def status(self) -> LimitsStatus:
        now = time.monotonic()
        due = now >= self.retry_at if self.down is not None else now - self.heard_at >= self.retry_every
        if due:
            # A worker with no keyed traffic would otherwise say "shared" of a Redis long
            # gone, or "degraded" of one long back: /readyz asks, at most every retry_every.
            # With a script that only reads, not PING: a server that answers PING but not
            # EVALSHA as Redis does was said to be "shared" while every worker counted alone.
            self._shared(self._read_check)
        return LimitsStatus("redis", self.down is None, self.down)

    def admit(self, tenant: Tenant, reserve: int = 0, prompt: int = 0) -> Window | None:
        """As the parent's, with `reserve` tokens held for the request until `charge` settles
        them; its reservation number is negative, so a settlement tells it from a row of the
        local file (counted there while Redis was away)."""
        if tenant.rpm is None and tenant.tpm is None and tenant.budget is None:
            return None
        held = max(0, reserve) if tenant.tpm is not None else 0
        budget = tenant.budget
        spend = (
            None
            if budget is None
            else replace(self._period(tenant.name, budget), held=max(0, reserve), prompt=prompt)
        )
        args: list[str | int | float] = [_limit(tenant.rpm), _limit(tenant.tpm), WINDOW]
        args += [os.urandom(6).hex(), held]
        args += [budget.tokens, max(0, reserve), _gone_at(spend)] if budget and spend else [-1, 0, 0]
        answer = self._shared(
            lambda: _window(
                tenant,
                self._admit(keys=[*_keys(tenant.name)[:5], _budget_key(tenant.name, spend)], args=args),
                spend,
            )
        )
        if answer is None:
            return super().admit(tenant, reserve, prompt)
        window, over = answer
        return refuse_or_admit(tenant, window, over or None)

    def _period(self, name: str, budget: Budget) -> Spend:
        period, reset = spend_period(budget, self.clock())
        return Spend(budget, 0, period, reset)

    def spent(self, tenant: Tenant) -> Spend | None:
        if tenant.budget is None:
            return None
        spend = self._period(tenant.name, tenant.budget)
        used = self._shared(lambda: int(self.redis.hget(_budget_key(tenant.name, spend), "tokens") or 0))
        if used is None:  # Redis away: what this instance held meanwhile
            return super().spent(tenant)
        return replace(spend, used=used, shared=True)

    def used(self, tenant: Tenant) -> tuple[int, int]:
        keys = _keys(tenant.name)
        answer = self._shared(lambda: _pair(self._used(keys=[keys[0], keys[2]], args=[WINDOW])))
        if answer is None:
            return super().used(tenant)
        return answer

    def charge(
        self, tenant: Tenant, tokens: int, reservation: int | None = None, spend: Spend | None = None
    ) -> None:
        self._charge(tenant, tokens, (0, 0, 0), reservation)
        self._settle_spend(tenant, tokens, spend)

    def count(
        self,
        tenant: Tenant,
        prompt: int,
        completion: int,
        reservation: int | None = None,
        spend: Spend | None = None,
    ) -> None:
        self._charge(tenant, prompt + completion, (1, prompt, completion), reservation)
        self._settle_spend(tenant, prompt + completion, spend)

    def _settle_spend(self, tenant: Tenant, tokens: int, spend: Spend | None) -> None:
        """The budget's reservation settled where it was held: on Redis, or in this
        instance's state file while Redis was away at admission."""
        if spend is None:
            return
        if not spend.shared:
            self._settle(tenant, tokens, None, spend, (0, 0, 0), minute=False)
            return
        budget = spend.budget
        warn = math.ceil(budget.warn_at * budget.tokens) if budget.warn_at is not None else -1
        delta = max(0, tokens) - spend.held
        key = _budget_key(tenant.name, spend)
        answer = self._shared(lambda: _pair(self._spent(keys=[key], args=[delta, warn, _gone_at(spend)])))
        # Redis away: its reservation stays counted there, on the safe side.
        if answer is not None:
            settled(tenant.name, spend, answer[0], bool(answer[1]))

    def _charge(
        self, tenant: Tenant, tokens: int, totals: tuple[int, int, int], reservation: int | None
    ) -> None:
        charge = tokens if tenant.tpm is not None and tokens > 0 else 0
        settles = reservation if reservation is not None and reservation < 0 else None
        if not charge and not any(totals) and settles is None:
            return
        keys = _keys(tenant.name)
        settled = -settles if settles else 0
        args: list[str | int | float] = [charge, WINDOW, os.urandom(6).hex(), *totals, settled]
        answer = self._shared(lambda: self._count(keys=[keys[1], keys[2], keys[5], keys[3]], args=args))
        if answer is None:
            # Redis's reservation stays there until it leaves the window: counted twice, on
            # the safe side, for at most a minute.
            local = reservation if reservation is not None and reservation > 0 else None
            self._settle(tenant, tokens, local, None, (0, 0, 0))

    def totals(self, name: str) -> dict[str, int] | None:
        """A key's usage summed over every instance; None while Redis is away (the caller
        shows this instance's own metrics then)."""

        def read() -> dict[str, int]:
            return {str(f): int(v) for f, v in sorted(self.redis.hgetall(_keys(name)[5]).items())}

        return self._shared(read)

    def _shared(self, call: Callable[[], _T]) -> _T | None:
        """The call's answer from Redis; None when this worker counts locally instead."""
        now = time.monotonic()
        if self.down is not None and now < self.retry_at:
            return None
        try:
            answer = call()
        except redis.RedisError as exc:
            self._lost(f"{type(exc).__name__}: {exc}", now)
            return None
        except WRONG_SHAPE as exc:
            # Whatever the connection was in the middle of reading is not to be trusted.
            self.redis.connection_pool.disconnect()
            self._lost(f"it answered in a shape Redis does not ({type(exc).__name__}: {exc})", now)
            return None
        self.heard_at = now
        if self.down is not None:
            log.warning("Redis at %s answers again: rate limits are shared again", where(self.url))
            self.down = None
            metrics.LIMITS_SHARED.labels("redis").set(1)
        return answer

    def _lost(self, error: str, now: float) -> None:
        if self.down is None:
            log.warning(
                "Redis at %s failed (%s): this worker counts rate limits locally, and tries again every %gs",
                where(self.url),
                error,
                self.retry_every,
            )
        self.down = (
            f"Redis at {where(self.url)} failed ({error}); counting on this instance until it answers."
        )
        self.retry_at = now + self.retry_every
        metrics.LIMITS_SHARED.labels("redis").set(0)


def _budget_key(name: str, spend: Spend | None) -> str:
    # Under the key's hash tag, as the admission script's other keys are.
    return PREFIX + "{" + name + "}:budget:" + (spend.period if spend is not None else "-")


def _gone_at(spend: Spend) -> int:
    """When a period's spend may leave Redis: a day after the period, for `llmgw keys`."""
    return int(spend.reset.timestamp()) + 86400


def read_spend(url: str, name: str, spend: Spend) -> int | None:
    """A key's spend this period on Redis, for `llmgw keys`; None when Redis does not answer."""
    conn = client(url, 2.0)
    try:
        return int(conn.hget(_budget_key(name, spend), "tokens") or 0)
    except (redis.RedisError, *WRONG_SHAPE):
        return None
    finally:
        conn.close()


def _window(tenant: Tenant, answer: Any, spend: Spend | None) -> tuple[Window, str]:
    """The admit script's answer as a Window, and the limit it is over ("" for none);
    `spend`, the key's budget period, with what the script found spent in it."""
    requests, tokens, first_request, first_tokens, clock, over, reservation, spent = answer
    now = float(clock)
    window = Window(
        tenant.rpm,
        tenant.tpm,
        int(requests),
        int(tokens),
        (float(first_request) + WINDOW - now) if first_request else WINDOW,
        (float(first_tokens) + WINDOW - now) if first_tokens else 0.0,
        -int(reservation) if int(reservation) else None,
        replace(spend, used=int(spent), shared=True) if spend is not None else None,
    )
    if over and over not in ("requests", "tokens", "budget"):
        raise ValueError(f"the admit script said over {over!r}")
    return window, str(over or "")


def _pair(answer: Any) -> tuple[int, int]:
    requests, tokens = answer
    return int(requests), int(tokens)


def _limit(value: int | None) -> int:
    return -1 if value is None else value


def _keys(name: str) -> tuple[str, str, str, str, str, str]:
    """requests, tokens, tokens-total, reservations, reservation sequence, usage."""
    # One hash tag per key name, so a Redis Cluster would keep a key's entries on one node
    # (a script may only touch keys of one slot).
    base = PREFIX + "{" + name + "}:"
    return (
        base + "requests",
        base + "tokens",
        base + "tokens-total",
        base + "held",
        base + "held-seq",
        base + "usage",
    )
