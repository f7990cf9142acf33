"""The usage table's latency is the engines' answers: requests the gateway refuses itself are
counted, and not timed."""

from __future__ import annotations

from pathlib import Path

import httpx
from harness import Engine, gateway, model, plan, profile, wait_until, write_plan


def test_refused_requests_are_counted_but_not_in_the_latency(tmp_path: Path, engine_a: Engine) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("m", [profile([engine_a.url], "m")], max_output=8)]))
    with gateway(path, workers=1) as gw:
        ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):  # over the model's max_output: refused before any engine
            refused = httpx.post(gw.url + "/v1/chat/completions", json={**ask, "max_tokens": 100}, timeout=10)
            assert refused.status_code == 400, refused.text
        answered = httpx.post(gw.url + "/v1/chat/completions", json={**ask, "max_tokens": 4}, timeout=10)
        assert answered.status_code == 200, answered.text

        def series(name: str) -> float:
            text = httpx.get(gw.url + "/metrics", timeout=10).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(name + "{") and 'model="m"' in line
            )

        wait_until(lambda: series("llmgw_requests_total") == 4, 10, "four requests counted")
        assert series("llmgw_request_duration_seconds_count") == 1, "a refusal was timed as an answer"
