"""Replicas found by DNS, without a gateway process: how a name's answers become replicas,
and lookups against a DNS server on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from llmgw.gateway.settings import Settings, settings_from_env
from llmgw.gateway.state.discovery import Discovery
from llmgw.gateway.state.health import Health
from llmgw.gateway.state.routes import DnsGroup, RouteTable
from llmgw.gateway.upstream import FastTransport, Upstream
from llmgw.plan import Plan, PlanModel, PlanProfile, PlanReplica, Workload
from tests.gateway.dns_server import DnsServer
from tests.plans import plan_of

ENDPOINT = "http://engines.llmgw.test:8080"


def _plan(endpoint: str = ENDPOINT) -> Plan:
    profile = PlanProfile(
        name="cpu", engine="llamacpp", priority=100, weight=1, ctx_size=8192, args=(),
        gpus=0, node_selector={}, served_name="m", external=False,
        workload=Workload(name="m-cpu", replicas=2),
        replicas=(PlanReplica(endpoint=endpoint, discovery="dns"),),
    )
    model = PlanModel(
        name="m", aliases=(), task="chat", source="hf://o/r/m.gguf", format="gguf",
        context_length=8192, replicas=2, file="catalog/m.yaml", profiles=(profile,), warnings=(),
    )
    return plan_of([model])


def test_a_new_address_joins_only_after_its_first_health_check():
    group = DnsGroup(ENDPOINT)
    joined = group.answered(["127.0.0.3", "127.0.0.2"])
    assert [r.endpoint for r in joined] == ["http://127.0.0.2:8080", "http://127.0.0.3:8080"]
    assert not any(r.healthy for r in group.replicas), "listed is not ready"


def test_a_vanished_address_takes_no_new_requests_and_goes_once_its_last_one_ends():
    group = DnsGroup(ENDPOINT)
    group.answered(["127.0.0.2", "127.0.0.3"])
    leaving = group.replicas[0]
    leaving.inflight = 1
    assert group.answered(["127.0.0.3"]) == []
    assert [r.endpoint for r in group.replicas] == ["http://127.0.0.3:8080"]
    group.sweep()
    assert list(group.draining) == ["http://127.0.0.2:8080"], "kept while a request is in flight"
    leaving.inflight = 0
    group.sweep()
    assert group.draining == {}


def test_an_address_that_comes_back_while_draining_keeps_its_state():
    group = DnsGroup(ENDPOINT)
    group.answered(["127.0.0.2"])
    replica = group.replicas[0]
    replica.healthy, replica.inflight = True, 2
    group.answered([])
    assert group.answered(["127.0.0.2"]) == []
    assert group.replicas == (replica,) and group.draining == {}


def test_a_failed_lookup_keeps_the_last_answer():
    group = DnsGroup(ENDPOINT)
    group.answered(["127.0.0.2"])
    group.failed("looking up engines.llmgw.test failed")
    assert len(group.replicas) == 1 and group.error
    group.answered(["127.0.0.2"])
    assert group.error is None


def test_ipv6_addresses_are_bracketed_and_the_v1_root_kept():
    assert DnsGroup("http://x.test:8000/v1").member("fd00::1") == "http://[fd00::1]:8000/v1"


def test_a_reload_keeps_each_names_addresses_and_their_health():
    first = RouteTable(_plan(), created=0)
    group = first.groups[ENDPOINT]
    group.answered(["127.0.0.2"])
    second = RouteTable(_plan(), 1, first.replicas, first.groups)
    assert second.groups[ENDPOINT] is group
    profile = second.models["m"].tiers[0][0]
    assert profile.members() == group.replicas
    assert set(second.every_replica()) == {"http://127.0.0.2:8080"}


def test_dns_servers_are_read_from_the_environment():
    servers = "127.0.0.1:5353, [::1]:53, 10.96.0.10"
    settings = settings_from_env({"LLMGW_PLAN": "p.json", "LLMGW_DNS_SERVERS": servers})
    assert settings.dns_servers == (("127.0.0.1", 5353), ("::1", 53), ("10.96.0.10", 53))
    with pytest.raises(Exception, match="ADDRESS:PORT"):
        settings_from_env({"LLMGW_PLAN": "p.json", "LLMGW_DNS_SERVERS": "kube-dns:53"})


def _discovery(server: DnsServer) -> Discovery:
    host, port = server.address.split(":")
    settings = Settings(plan_path=Path("p.json"), dns_servers=((host, int(port)),), dns_interval=2)
    return Discovery(
        settings, Health(Upstream(FastTransport(), httpx.AsyncHTTPTransport()), failures=2, timeout=0.2)
    )


def test_lookups_against_a_dns_server_on_loopback():
    with DnsServer(ttl=7) as server:
        server.records["engines.llmgw.test"] = ["127.0.0.2", "127.0.0.3"]
        discovery = _discovery(server)
        addresses, ttl = asyncio.run(discovery.lookup("engines.llmgw.test"))
        assert sorted(addresses) == ["127.0.0.2", "127.0.0.3"] and ttl == 7
        assert asyncio.run(discovery.lookup("gone.llmgw.test"))[0] == [], "NXDOMAIN: no ready pod"


def test_a_failing_server_keeps_the_last_answer_and_says_why():
    with DnsServer() as server:
        server.records["engines.llmgw.test"] = ["127.0.0.2"]
        discovery = _discovery(server)
        group = DnsGroup(ENDPOINT)

        async def twice() -> None:
            await discovery.refresh(group)
            server.failing = True
            await discovery.refresh(group)

        asyncio.run(twice())
    assert [r.endpoint for r in group.replicas] == ["http://127.0.0.2:8080"]
    assert group.error and "routing to the 1 address(es)" in group.error
