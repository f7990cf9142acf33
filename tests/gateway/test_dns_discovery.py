"""The gateway finds a workload's pods by DNS, as in a Kubernetes headless Service: addresses
added and removed while it serves under load, and not one request fails; a DNS server
that stops answering leaves the last answer routing, and /readyz says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from dns_server import DnsServer
from harness import Engine, Load, engine, free_port, gateway, model, plan, write_plan

from llmgw.plan import PlanProfile, PlanReplica, Workload

NAME = "engines.llmgw.test"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture
def engines() -> Iterator[dict[str, Engine]]:
    # One port on every address, as every pod of a Deployment listens on the same one.
    port = free_port(HOSTS[0])
    with ExitStack() as stack:
        yield {h: stack.enter_context(engine(f"pod-{h}", h, "--port", str(port))) for h in HOSTS}


def _plan_file(tmp_path: Path, port: int) -> Path:
    # A Kubernetes workload, as `llmgw plan --target kubernetes` writes it: one name, two pods.
    profile = PlanProfile(
        name="cpu", engine="llamacpp", priority=100, weight=1, ctx_size=8192, args=(),
        gpus=0, node_selector={}, served_name="m", external=False,
        workload=Workload(name="m-cpu", replicas=2),
        replicas=(PlanReplica(endpoint=f"http://{NAME}:{port}", discovery="dns"),),
    )
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("m", [profile])]))
    return path


def _asking(n: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "fake_delay_first": 0.05}


def _routes_to(gw, expected: set[str], port: int) -> None:
    want = {f"http://{h}:{port}" for h in expected}

    def check(ready: dict) -> bool:
        group = ready["discovery"][0]
        return set(group["replicas"]) == want and not group["draining"]

    gw.every_worker(check, 20, f"routing to exactly {sorted(expected)}")


def test_addresses_added_and_removed_under_load_and_no_request_fails(engines, tmp_path):
    port = int(engines[HOSTS[0]].url.rsplit(":", 1)[1])
    with DnsServer(ttl=1) as dns:
        dns.records[NAME] = [HOSTS[0], HOSTS[1]]
        env = {"LLMGW_DNS_SERVERS": dns.address, "LLMGW_DNS_INTERVAL": "0.5"}
        with gateway(_plan_file(tmp_path, port), **env) as gw, Load(gw.url, _asking, clients=6) as load:
            _routes_to(gw, {HOSTS[0], HOSTS[1]}, port)
            time.sleep(1)
            dns.records[NAME] = list(HOSTS)  # a pod became ready
            _routes_to(gw, set(HOSTS), port)
            time.sleep(1.5)
            dns.records[NAME] = [HOSTS[1], HOSTS[2]]  # a pod is going away
            _routes_to(gw, {HOSTS[1], HOSTS[2]}, port)
            before = engines[HOSTS[0]].stats()["requests"]
            served = load.done
            time.sleep(1.5)
            assert load.done > served, "the load kept running"
            after = engines[HOSTS[0]].stats()["requests"]
        assert load.failures == [], f"{len(load.failures)} of {load.done} requests failed"
    assert after == before, "the removed address got no new requests"
    counts = {h: e.stats()["requests"] for h, e in engines.items()}
    assert all(counts.values()), f"traffic reached every address listed at some point: {counts}"


def test_a_failing_dns_server_keeps_the_last_answer_and_readyz_says_so(engines, tmp_path):
    port = int(engines[HOSTS[0]].url.rsplit(":", 1)[1])
    with DnsServer(ttl=1) as dns:
        dns.records[NAME] = [HOSTS[0]]
        env = {"LLMGW_DNS_SERVERS": dns.address, "LLMGW_DNS_INTERVAL": "0.5"}
        with gateway(_plan_file(tmp_path, port), **env) as gw:
            _routes_to(gw, {HOSTS[0]}, port)
            dns.failing = True
            gw.every_worker(lambda r: "error" in r["discovery"][0], 20, "the failed lookup")
            ready = httpx.get(gw.url + "/readyz").json()
            assert "routing to the 1 address(es)" in ready["discovery"][0]["error"]
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            answers = [httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30).status_code
                       for _ in range(5)]
            assert answers == [200] * 5
            dns.failing = False
            gw.every_worker(lambda r: "error" not in r["discovery"][0], 20, "the lookup to recover")
