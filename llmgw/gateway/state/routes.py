"""Route tables: everything about a plan that does not depend on the request, built once.

A table is built when a plan is loaded and never changed afterwards; a reload builds a
new one and swaps it in, so a request keeps the table (and the replicas) it started with.
Replica objects are carried from one table to the next by endpoint, because their health
and in-flight counts describe the engine, not the plan that happened to list it.

A replica endpoint with `discovery: dns` is a name that lists every instance (a Kubernetes
headless Service, Consul, Nomad): its DnsGroup holds one Replica per address it resolved
to, and changes as the answers do (state/discovery.py), while the table stays as it is.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from llmgw.engines import engine
from llmgw.errors import PlanError
from llmgw.gateway.api import APIS, answered_by
from llmgw.gateway.errors import ApiError, echo
from llmgw.gateway.state import metrics
from llmgw.gateway.upstream import Target
from llmgw.plan import Plan, PlanModel, PlanProfile

# Prefix routing: a replica takes a prefix while it has fewer than this many times the
# mean requests in flight (plus one); past that the prefix spills to its next replica, so
# one hot system prompt cannot pile every conversation onto one engine.
LOAD_BOUND = 1.25
def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class Replica:
    """One engine endpoint, as this worker sees it."""

    __slots__ = (
        "endpoint",
        "urls",
        "health_url",
        "inflight",
        "healthy",
        "failures",
        "seed",
        "streak",
        "ejected_until",
        "ejections",
        "agent",
    )

    def __init__(self, endpoint: str, agent: str | None = None) -> None:
        self.endpoint = endpoint
        # An on-demand replica's node agent, which starts its engine when asked: such a
        # replica is not probed, since "not running" is its resting state, not a fault.
        self.agent = agent.rstrip("/") if agent else None
        # Its place on the hash ring: from the endpoint alone, so every worker agrees.
        self.seed = int.from_bytes(hashlib.blake2b(endpoint.encode(), digest_size=8).digest(), "big")
        base = endpoint.rstrip("/")
        # Plans may give the engine's root or its /v1 root; both mean the same engine.
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        parsed = urlsplit(base)
        port = parsed.port  # a ValueError for a port past 65535
        # A port of 0 would be taken as "none"; the failure would wait for the first request.
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port {port} is not between 1 and 65535")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{endpoint} is not an http:// or https:// address")
        scheme = parsed.scheme
        key = (parsed.hostname, port or (443 if scheme == "https" else 80))
        origin, prefix = f"{scheme}://{parsed.netloc}", parsed.path.rstrip("/")
        self.health_url = Target(scheme, key, origin, prefix + "/health")
        self.urls = {kind: Target(scheme, key, origin, prefix + api.upstream) for kind, api in APIS.items()}
        self.inflight = 0
        # Unknown is not down: a replica is in rotation until checks say otherwise.
        self.healthy = True
        self.failures = 0
        # Outlier ejection (state/outlier.py): real requests failed in a row, the monotonic
        # time an ejection ends (0: not ejected), and how many times it has been ejected.
        self.streak = 0
        self.ejected_until = 0.0
        self.ejections = 0

    def hold(self) -> InFlight:
        """Count one request in flight here until the hold is released (see InFlight)."""
        return InFlight(self)

    def on_trial(self) -> bool:
        """Its ejection time is over, and no request has succeeded on it since."""
        return bool(self.ejected_until) and time.monotonic() >= self.ejected_until

    def routable(self) -> bool:
        """In rotation: healthy, not ejected, and on trial only while nothing is in flight
        to it (one trial request at a time, until one succeeds)."""
        if not self.healthy:
            return False
        if not self.ejected_until:
            return True
        return self.inflight == 0 and time.monotonic() >= self.ejected_until


class InFlight:
    """One request's place in a replica's in-flight count, and the only writer of that count.

    Counted once when taken and given back once: a second `release()` does nothing, so two
    paths that both end an answer cannot take it off twice. (When the proxy wrote the count
    itself, it went up in one place and down in ten, and a new branch had to remember it.)
    """

    __slots__ = ("replica", "_held", "after")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._held = True
        replica.inflight += 1
        # Called once with the count: an on-demand replica's lease goes back to its agent.
        self.after: Callable[[], None] | None = None

    def release(self) -> None:
        if self._held:
            self._held = False
            self.replica.inflight -= 1
            if self.after is not None:
                self.after()

    def then(self, after: Callable[[], None]) -> None:
        """Call `after` too when released, after what was asked before."""
        before = self.after
        self.after = after if before is None else _both(before, after)


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            second()

    return both


@dataclass
class PrefixCounts:
    """Prefix-routed requests that went to their prefix's own replica, and those that spilled."""

    hits: int = 0
    spills: int = 0


class DnsGroup:
    """The replicas a DNS name lists now, each with its own health and in-flight count.

    A new address joins rotation after its first health check answers; one that leaves
    the answer takes no new requests, and is forgotten once its last one finishes. When
    the resolver fails, the last answer stands, and `error` says so for /readyz.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        url = httpx.URL(endpoint)
        self.host = url.host
        self._scheme, self._port, self._path = url.scheme, url.port, url.path.rstrip("/")
        self.replicas: tuple[Replica, ...] = ()
        self.draining: dict[str, Replica] = {}
        self.error: str | None = None
        self.resolved_at: float | None = None
        self.next_at = 0.0  # event-loop time of the next lookup

    def member(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        port = f":{self._port}" if self._port else ""
        return f"{self._scheme}://{host}{port}{self._path}"

    def literal(self) -> str | None:
        """The host when it is an address already: nothing to look up."""
        try:
            return str(ipaddress.ip_address(self.host))
        except ValueError:
            return None

    def answered(self, addresses: list[str]) -> list[Replica]:
        """Take a lookup's answer; returns the replicas that are new, to be checked at once."""
        now = {r.endpoint: r for r in self.replicas}
        joined: list[Replica] = []
        kept: list[Replica] = []
        for endpoint in dict.fromkeys(self.member(a) for a in sorted(addresses)):
            replica = now.pop(endpoint, None) or self.draining.pop(endpoint, None)
            if replica is None:
                replica = Replica(endpoint)
                replica.healthy = False  # listed is not ready: the first health check decides
                joined.append(replica)
            kept.append(replica)
        self.draining.update(now)  # gone from the answer: no new requests, in-flight ones finish
        self.replicas = tuple(kept)
        self.error = None
        self.resolved_at = time.time()
        return joined

    def failed(self, why: str) -> None:
        self.error = why

    def sweep(self) -> None:
        """Forget the addresses that left the answer once nothing is in flight to them."""
        for endpoint in [e for e, r in self.draining.items() if r.inflight <= 0]:
            del self.draining[endpoint]

    def everyone(self) -> list[Replica]:
        return [*self.replicas, *self.draining.values()]


@dataclass(frozen=True)
class Profile:
    name: str
    served_name: str
    weight: int
    replicas: tuple[Replica, ...]
    routing: str = "least-loaded"
    groups: tuple[DnsGroup, ...] = ()
    slots: int = 4  # requests each replica serves at once (the engine's, from its args)
    prefix: PrefixCounts = field(default_factory=PrefixCounts, compare=False)
    _turns: Iterator[int] = field(default_factory=itertools.count, compare=False, repr=False)

    def members(self) -> tuple[Replica, ...]:
        """The planned replicas and, for each DNS name, the addresses it lists now."""
        if not self.groups:
            return self.replicas
        return self.replicas + tuple(r for g in self.groups for r in g.replicas)

    def by_prefix(self, key: int, healthy: list[Replica]) -> list[Replica]:
        """Rendezvous (highest random weight) hashing with bounded load.

        Each replica's rank for a prefix depends only on the two, so a replica joining or
        leaving moves only the prefixes it wins or held. The best-ranked replica under the
        load bound comes first; the others follow in rank order, as failover.
        """
        ranked = sorted(healthy, key=lambda r: _mix(key ^ r.seed), reverse=True)
        bound = math.ceil(LOAD_BOUND * (sum(r.inflight for r in ranked) + 1) / len(ranked))
        for i, replica in enumerate(ranked):
            if replica.inflight + 1 <= bound:
                if i:
                    self.prefix.spills += 1
                    metrics.labelled(metrics.PREFIX_ROUTES, self.served_name, self.name, "spill").inc()
                    return [replica, *ranked[:i], *ranked[i + 1 :]]
                break
        self.prefix.hits += 1
        metrics.labelled(metrics.PREFIX_ROUTES, self.served_name, self.name, "hit").inc()
        return ranked

    def in_turn(self) -> tuple[Replica, ...]:
        """The replicas, starting one further along each time. "Fewest in flight" picks the
        first of equals, so without this, one client asking one question at a time would
        only ever reach the first replica."""
        members = self.members()
        count = len(members)
        if count < 2:
            return members
        start = next(self._turns) % count
        return members[start:] + members[:start]


@dataclass(frozen=True)
class Model:
    name: str
    task: str
    max_output: int | None
    # Profiles grouped by priority, lowest priority number first (as with DNS SRV).
    tiers: tuple[tuple[Profile, ...], ...]
    listing: Mapping[str, Any]
    # The longest an answer can run when nothing else bounds it: what such a request holds of
    # its key's tpm and budget until it ends.
    context_length: int = 0

    def candidates(
        self, prompt_key: Callable[[], int | None] | None = None
    ) -> Iterator[tuple[Profile, Replica]]:
        """Replicas to try, best first: by tier, then weight, then the prefix's own replica
        (for a prefix-routed profile and a request with a prompt), else fewest in flight.

        `prompt_key` is called only when there is a choice to make (a prefix-routed profile
        with two replicas or more): hashing the prompt on every request cost the one-replica
        case 15% of its throughput for nothing.
        """
        key: int | None = None
        hashed = False
        for tier in self.tiers:
            for profile in tier if len(tier) == 1 else _by_weight(tier):
                healthy = [r for r in profile.in_turn() if r.routable()]
                if prompt_key is not None and profile.routing == "prefix" and len(healthy) > 1:
                    if not hashed:
                        key, hashed = prompt_key(), True
                    if key is not None:
                        for replica in profile.by_prefix(key, healthy):
                            yield profile, replica
                        continue
                while healthy:
                    best = min(healthy, key=_inflight)
                    yield profile, best
                    healthy.remove(best)

    def has_replicas(self) -> bool:
        return any(p.members() for tier in self.tiers for p in tier)

    def names(self) -> tuple[str, ...]:
        """Its name and aliases: what a key's `models` entries are matched against."""
        return (self.name, *self.listing["aliases"])


def _inflight(replica: Replica) -> int:
    return replica.inflight


def _by_weight(tier: tuple[Profile, ...]) -> list[Profile]:
    # Weighted order without replacement (Efraimidis-Spirakis): the first pick follows the
    # weights, and the rest remain as fallbacks. Weight 0 means "only when the others
    # cannot answer", as in SRV records.
    keyed = [(random.random() ** (1.0 / p.weight) if p.weight > 0 else -1.0, p) for p in tier]
    keyed.sort(key=lambda kp: kp[0], reverse=True)
    return [p for _, p in keyed]


class RouteTable:
    """A loaded plan, ready to route: lookups by name or alias, and the /v1/models answer."""

    @classmethod
    def from_plan(
        cls,
        plan: Plan,
        created: int,
        replicas_before: Mapping[str, Replica] | None = None,
        groups_before: Mapping[str, DnsGroup] | None = None,
    ) -> RouteTable:
        """The table for a plan that passed its schema; PlanError when it still cannot be routed.

        The schema cannot see everything a URL parser does, and a plan that is accepted
        and then fails to route has already replaced the file every worker (and the next
        start) reads.
        """
        try:
            return cls(plan, created, replicas_before, groups_before)
        except PlanError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(
                f"the plan passes its schema but cannot be routed ({type(exc).__name__}: {exc}); "
                "write it with `llmgw plan` rather than by hand."
            ) from None

    def __init__(
        self,
        plan: Plan,
        created: int,
        replicas_before: Mapping[str, Replica] | None = None,
        groups_before: Mapping[str, DnsGroup] | None = None,
    ) -> None:
        self.plan = plan
        self.digest: str = plan.digest
        self.replicas: dict[str, Replica] = {}
        # DNS names by endpoint, carried across reloads like replicas: what they resolved
        # to, and each address's health, describe the cluster, not the plan.
        self.groups: dict[str, DnsGroup] = {}
        self._groups_before = groups_before or {}
        self.models: dict[str, Model] = {}
        self._by_name: dict[str, Model] = {}
        before = replicas_before or {}
        for planned in plan.models:
            model = self._model(planned, created, before)
            self.models[model.name] = model
        self._groups_before = {}  # not kept alive past the reload that carried them
        for model in self.models.values():
            self._by_name[model.name] = model
        # Aliases never shadow a real name; the compiler lints such clashes, but a plan
        # written by hand should still route a name to the model that carries it.
        for model in self.models.values():
            for alias in model.listing["aliases"]:
                self._by_name.setdefault(alias, model)
        self.listing_body: bytes = json.dumps(
            {"object": "list", "data": [m.listing for m in self.models.values()]}
        ).encode()
        self.model_bodies: dict[str, bytes] = {
            name: json.dumps(model.listing).encode() for name, model in self._by_name.items()
        }

    def _model(self, planned: PlanModel, created: int, before: Mapping[str, Replica]) -> Model:
        profiles = sorted(planned.profiles, key=lambda p: p.priority)  # stable: plan order
        tiers: dict[int, list[Profile]] = {}
        for p in profiles:
            replicas = tuple(
                self._replica(r.endpoint, before, planned, p, self._agent(p, r.node))
                for r in p.replicas
                if r.discovery is None
            )
            groups = tuple(self._group(r.endpoint) for r in p.replicas if r.discovery == "dns")
            routing = p.routing or ("least-loaded" if planned.task in ("embedding", "rerank") else "prefix")
            slots = engine(p.engine).slots(p.args)
            profile = Profile(p.name, p.served_name, p.weight, replicas, routing, groups, slots)
            tiers.setdefault(p.priority, []).append(profile)
        listing: dict[str, Any] = {
            "id": planned.name,
            "object": "model",
            "created": created,
            "owned_by": "llmgw",
        }
        # Undescribed means no key at all: clients show "" or null as an empty description.
        if planned.description:
            listing["description"] = planned.description
        listing["context_length"] = planned.context_length
        if planned.max_output is not None:
            listing["max_output"] = planned.max_output
        listing["aliases"] = list(planned.aliases)
        if planned.fallbacks:  # absent: none, as listings were
            listing["fallbacks"] = list(planned.fallbacks)
        listing["task"] = planned.task
        # What a client may send it to, as paths: a client need not know what a task implies.
        listing["endpoints"] = [api.path for api in answered_by(planned.task)]
        if any(p.on_demand for p in planned.profiles):  # absent: always on, as listings were
            listing["start"] = "on-demand"
        return Model(
            name=planned.name,
            task=planned.task,
            max_output=planned.max_output,
            tiers=tuple(tuple(t) for t in tiers.values()),
            listing=listing,
            context_length=planned.context_length,
        )

    def _agent(self, profile: PlanProfile, node: str | None) -> str | None:
        if not profile.on_demand or node is None:
            return None
        planned = self.plan.node(node)
        return planned.agent if planned is not None else None

    def _replica(
        self,
        endpoint: str,
        before: Mapping[str, Replica],
        model: PlanModel,
        profile: PlanProfile,
        agent: str | None = None,
    ) -> Replica:
        replica = self.replicas.get(endpoint) or before.get(endpoint)
        if replica is not None and replica.agent != agent:
            replica = None  # started on demand now, or no longer: a replica of another kind
        if replica is None:
            try:
                replica = Replica(endpoint, agent)
            except (ValueError, httpx.InvalidURL) as exc:
                raise PlanError(
                    f"model '{model.name}' (profile '{profile.name}') lists the endpoint "
                    f"{endpoint!r}, which the gateway cannot send to: {exc}. Fix the catalogue's "
                    "endpoints or the fleet's node address, and plan again."
                ) from None
        self.replicas[endpoint] = replica
        return replica

    def _group(self, endpoint: str) -> DnsGroup:
        group = self.groups.get(endpoint) or self._groups_before.get(endpoint) or DnsGroup(endpoint)
        self.groups[endpoint] = group
        return group

    def slots(self) -> dict[str, int]:
        """Requests each replica serves at once, by endpoint (its profile's engine args)."""
        return {
            r.endpoint: p.slots
            for m in self.models.values()
            for tier in m.tiers
            for p in tier
            for r in p.members()
        }

    def every_replica(self) -> dict[str, Replica]:
        """Planned and discovered replicas by endpoint: what health checks and /metrics cover."""
        if not self.groups:
            return self.replicas
        out = dict(self.replicas)
        for group in self.groups.values():
            out.update((r.endpoint, r) for r in group.everyone())
        return out

    def lookup(self, name: str, may_use: Callable[[tuple[str, ...]], bool] | None = None) -> Model:
        """The model a client named, by name or alias; else the 404 it should see, whose
        hint names only models `may_use` allows (a key's), as /v1/models lists only those."""
        model = self._by_name.get(name)
        if model is not None:
            return model
        usable = {n: m for n, m in self._by_name.items() if may_use is None or may_use(m.names())}
        # A name no model could have is compared with none: difflib over megabytes is slow.
        closest = self.closest(name, usable) if len(name) <= 256 else None
        if closest:
            hint = f"did you mean '{closest}'? GET /v1/models lists them all."
        elif not self.models:
            hint = "the plan it serves has no models."
        elif not usable:
            hint = "GET /v1/models lists the ones your key may use."
        else:
            hint = f"it serves {self._some_names(usable)} (GET /v1/models lists them)."
        raise ApiError(
            404, f"There is no model {echo(name)} here; {hint}", param="model", code="model_not_found"
        )

    @staticmethod
    def _some_names(usable: dict[str, Model], most: int = 5) -> str:
        names = [f"'{n}'" for n in dict.fromkeys(m.name for m in usable.values())]
        if len(names) <= most:
            return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        return ", ".join(names[:most]) + f" and {len(names) - most} more"

    def closest(self, name: str, among: dict[str, Model] | None = None) -> str | None:
        """The served name most like `name`, to suggest in a 404."""
        among = self._by_name if among is None else among
        matches = difflib.get_close_matches(name, list(among), n=1, cutoff=0.4)
        if not matches:
            return None
        return among[matches[0]].name
