"""Replicas found by DNS: every name a plan marks `discovery: dns`, looked up again when its
answer's TTL runs out (and at least every LLMGW_DNS_INTERVAL seconds).

A Kubernetes headless Service lists the addresses of its ready pods, so a pod that starts,
stops or fails its readiness probe shows up here within a TTL; Consul and Nomad answer the
same way. An answer with no addresses (NXDOMAIN, or no A/AAAA records) is an answer: the
workload has no ready pod. A lookup that fails (timeout, SERVFAIL, no server) is not: the
last answer keeps routing, and /readyz says how long ago it came.
"""

from __future__ import annotations

import asyncio
import logging
import time

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from llmgw.errors import ServiceError
from llmgw.gateway.settings import Settings
from llmgw.gateway.state.health import Health
from llmgw.gateway.state.reload import PlanState
from llmgw.gateway.state.routes import DnsGroup

log = logging.getLogger("llmgw.gateway")

TICK = 0.25  # how often due names are looked up and drained addresses swept
SHORTEST = 0.5  # an answer with TTL 0 is not looked up again more often than this


class LookupFailed(ServiceError):
    pass


class Discovery:
    def __init__(self, settings: Settings, health: Health) -> None:
        self.health = health
        self.interval = settings.dns_interval
        if settings.dns_servers is None:
            self.resolver = dns.asyncresolver.Resolver()
        else:
            self.resolver = dns.asyncresolver.Resolver(configure=False)
            self.resolver.nameservers = [
                dns.nameserver.Do53Nameserver(host, port) for host, port in settings.dns_servers
            ]
        # A lookup that takes longer than this is a failure; the last answer stands meanwhile.
        self.resolver.lifetime = max(1.0, min(self.interval, 3.0))

    async def watch(self, state: PlanState) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                groups = list(state.table.groups.values())
                for group in groups:
                    group.sweep()
                due = [g for g in groups if g.next_at <= loop.time()]
                if due:
                    await asyncio.gather(*(self.refresh(g) for g in due))
            except Exception:  # a bug in one round must not stop discovery for good
                log.exception("DNS discovery round failed")
            await asyncio.sleep(TICK)

    async def refresh(self, group: DnsGroup) -> None:
        loop = asyncio.get_running_loop()
        literal = group.literal()
        try:
            addresses, ttl = ([literal], self.interval) if literal else await self.lookup(group.host)
        except LookupFailed as exc:
            kept = len(group.replicas)
            when = time.strftime("%H:%M:%SZ", time.gmtime(group.resolved_at)) if group.resolved_at else None
            since = f"the answer of {when}" if when else "no answer yet"
            if group.error is None:
                log.warning("looking up %s failed (%s); routing to %s", group.host, exc, since)
            group.failed(
                f"looking up {group.host} failed ({exc}); routing to the {kept} address(es) of "
                f"{since}. Check the DNS server (LLMGW_DNS_SERVERS) and the name in the plan."
            )
            group.next_at = loop.time() + max(SHORTEST, min(self.interval, 1.0))
            return
        before = {r.endpoint for r in group.replicas}
        joined = group.answered(addresses)
        group.next_at = loop.time() + max(SHORTEST, min(ttl, self.interval))
        left = before - {r.endpoint for r in group.replicas}
        if joined or left:
            log.info(
                "%s now lists %d address(es): %d new, %d gone",
                group.host,
                len(group.replicas),
                len(joined),
                len(left),
            )
        # Checked at once, not at the next health round: a new pod serves as soon as it says so.
        await asyncio.gather(*(self.health.probe(r) for r in joined))

    async def lookup(self, host: str) -> tuple[list[str], float]:
        """Every A and AAAA address of `host`, and the shortest TTL among them."""
        addresses: list[str] = []
        ttls: list[float] = []
        for kind in (dns.rdatatype.A, dns.rdatatype.AAAA):
            try:
                # Absolute, never tried under the search domains: a name in a plan is whole.
                answer = await self.resolver.resolve(host.rstrip(".") + ".", kind, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.Timeout:
                raise LookupFailed(f"no answer within {self.resolver.lifetime:g}s") from None
            except dns.exception.DNSException as exc:
                raise LookupFailed(f"{type(exc).__name__}: {exc}") from None
            addresses += [r.address for r in answer]
            if answer.rrset is not None:
                ttls.append(answer.rrset.ttl)
        return addresses, min(ttls, default=self.interval)
