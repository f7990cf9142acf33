"""Fallbacks between models through the real gateway, with stand-in engines: a model that
cannot answer is answered by its fallback (streams too), which the answer names and a header
says; a 4xx is the caller's and passes through untouched; a key that may not use the
fallback gets the model's own failure."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from harness import Engine, Gateway, dead_endpoint, gateway, key_digest, model, plan, profile, write_plan

FULL, NARROW = "sk-full", "sk-narrow"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("fallbacks")
    path = tmp / "plan.json"
    models = [
        # Nothing listens where `dead` is placed; `flaky` is engine a, which a test makes fail.
        model("dead", [profile([dead_endpoint()], "dead")]).model_copy(update={"fallbacks": ("backup",)}),
        model("flaky", [profile([engine_a.url], "flaky")]).model_copy(update={"fallbacks": ("backup",)}),
        model("backup", [profile([engine_b.url], "backup")]),
        # A fallback that writes at most 100 tokens, behind a model that sets no limit.
        model("unbounded", [profile([dead_endpoint()], "unbounded")]).model_copy(
            update={"fallbacks": ("small",)}
        ),
        model("small", [profile([engine_b.url], "small")], max_output=100),
    ]
    write_plan(path, plan(models))
    keys = tmp / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: full, sha256: {key_digest(FULL)}}}\n"
        f"  - {{name: narrow, sha256: {key_digest(NARROW)}, models: [dead, flaky]}}\n"
    )
    with gateway(path, LLMGW_KEYS_FILE=str(keys)) as g:
        yield g


def post(gw: Gateway, name: str, key: str = FULL, **body: object) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": name, "messages": [{"role": "user", "content": "hi"}], **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_dead_model_is_answered_by_its_fallback_which_the_answer_names(gw: Gateway) -> None:
    answer = post(gw, "dead")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llmgw-fallback"] == "backup"
    body = answer.json()
    assert body["model"] == "backup" and body["system_fingerprint"] == "b", body
    scraped = httpx.get(gw.url + "/metrics", timeout=10).text
    assert 'llmgw_fallbacks_total{fallback="backup",model="dead"}' in scraped


def test_a_stream_falls_back_before_its_first_byte(gw: Gateway) -> None:
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json={"model": "dead", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={"Authorization": f"Bearer {FULL}"},
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["x-llmgw-fallback"] == "backup"
        events = [line[6:] for line in answer.iter_lines() if line.startswith("data: {")]
    assert events and all(json.loads(e)["model"] == "backup" for e in events)


def test_an_engine_error_before_the_first_byte_falls_back(gw: Gateway) -> None:
    answer = post(gw, "flaky", fake_status=500, fake_only="a")
    assert answer.status_code == 200 and answer.headers["x-llmgw-fallback"] == "backup", answer.text


def test_a_4xx_is_the_callers_and_never_tried_elsewhere(gw: Gateway, engine_b: Engine) -> None:
    before = engine_b.stats()["requests"]
    answer = post(gw, "flaky", fake_status=400, fake_only="a")
    assert answer.status_code == 400 and "x-llmgw-fallback" not in answer.headers
    assert engine_b.stats()["requests"] == before, "the fallback was not asked"


def test_a_key_that_may_not_use_the_fallback_gets_the_models_own_failure(gw: Gateway) -> None:
    answer = post(gw, "dead", key=NARROW)
    assert answer.status_code in (502, 503) and "x-llmgw-fallback" not in answer.headers
    assert "dead" in answer.json()["error"]["message"]


def test_models_list_their_fallbacks(gw: Gateway) -> None:
    listed = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {FULL}"}, timeout=10).json()
    by_id = {m["id"]: m for m in listed["data"]}
    assert by_id["dead"]["fallbacks"] == ["backup"]
    assert "fallbacks" not in by_id["backup"], "absent, not empty, for a model without"


def test_the_dashboard_shows_fallbacks(gw: Gateway) -> None:
    page = httpx.get(gw.url + "/dashboard", timeout=10).text
    assert "falls back to" in page and "<code>backup</code>" in page


@pytest.mark.parametrize("asked", [{"max_tokens": 3000}, {}], ids=["3000", "none"])
def test_a_fallback_gets_the_request_capped_at_its_own_max_output(
    gw: Gateway, engine_b: Engine, asked: dict[str, int]
) -> None:
    """`small` refuses 3,000 tokens when asked itself; as a fallback it must not be sent them."""
    assert post(gw, "small", max_tokens=3000).status_code == 400
    answer = post(gw, "unbounded", **asked)
    assert answer.status_code == 200 and answer.headers["x-llmgw-fallback"] == "small", answer.text
    seen = engine_b.stats()["max_tokens_seen"][-1]
    assert seen == 100, f"the fallback was sent max_tokens {seen}, past its max_output of 100"


def test_a_key_sees_only_the_fallbacks_it_may_use(gw: Gateway) -> None:
    """`narrow` may use `dead` but not its fallback `backup`: its listing names no model it
    cannot reach."""
    listed = httpx.get(
        gw.url + "/v1/models", headers={"Authorization": f"Bearer {NARROW}"}, timeout=10
    ).json()
    by_id = {m["id"]: m for m in listed["data"]}
    assert "backup" not in by_id and "fallbacks" not in by_id["dead"], by_id["dead"]
