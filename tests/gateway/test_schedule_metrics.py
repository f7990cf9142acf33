"""What /metrics and the dashboard say about a busy model (issue 34): each replica's slots
and how many are in use over every worker, the requests waiting per model and key, and how
long they waited."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from busy import ask, served, slots, stats
from harness import Gateway, wait_until


def metric(gw: Gateway, name: str, **labels: str) -> float | None:
    text = httpx.get(gw.url + "/metrics", headers=gw.probe_headers(), timeout=10).text
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_show_slots_in_use_and_who_waits_for_them(tmp_path: Path) -> None:
    with slots(1, service_s=0.05) as e, served(tmp_path, e, 1) as gw, ThreadPoolExecutor(3) as pool:
        holder = pool.submit(ask, gw, "batch", "holder", fake_service=3)
        wait_until(lambda: stats(e)["in_flight"] == 1, 10, "the long request to take the one slot")
        waiting = [pool.submit(ask, gw, "quiet") for _ in range(2)]
        wait_until(
            lambda: metric(gw, "llmgw_queue_waiting", model="chat", key="quiet") == 2,
            10,
            "the two quiet requests counted as waiting",
        )
        assert metric(gw, "llmgw_replica_slots", replica=e.url) == 1
        assert metric(gw, "llmgw_replica_slots_in_use", replica=e.url) == 1
        status = httpx.get(gw.url + "/dashboard/status.json", headers=gw.probe_headers(), timeout=10)
        assert status.json()["usage"]["models"]["chat"]["waiting"] == 2, "the dashboard missed them"
        answers = [holder.result(), *(w.result() for w in waiting)]
        assert [a.status_code for a in answers] == [200] * 3
        assert all(int(a.headers["x-llmgw-queue-wait-ms"]) > 0 for a in answers[1:])
        time.sleep(0.1)
        assert metric(gw, "llmgw_queue_waiting", model="chat", key="quiet") == 0
        assert metric(gw, "llmgw_replica_slots_in_use", replica=e.url) == 0
        assert (metric(gw, "llmgw_queue_wait_seconds_count", model="chat") or 0) >= 2
