"""Requests an attacker (or a broken client) sends, against a real gateway: each is answered
with a sentence and a 4xx, reaches no engine it should not, and leaves no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import (
    ROOT,
    Engine,
    Gateway,
    gateway,
    model,
    plan,
    profile,
    subprocess_env,
    wait_until,
    write_plan,
)

from llmgw.plan import Plan, PlanModel

ADMIN = "admin-secret"
METRICS = "metrics-secret"


def plan_on(a: str, b: str, *more: PlanModel) -> Plan:
    return plan(
        [
            model("chat-a", [profile([a], "served-a")], aliases=["alias-a"], max_output=100),
            model("plain", [profile([b], "plain")]),
            model("embed", [profile([a], "embed-x")], task="embedding"),
            *more,
        ]
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine) -> Iterator[Gateway]:
    doc = plan_on(engine_a.url, engine_b.url, model("retired", [profile([engine_b.url], "retired")]))
    path = tmp_path_factory.mktemp("hostile") / "plan.json"
    write_plan(path, doc)
    with gateway(path, LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_METRICS_TOKEN=METRICS) as g:
        g.env["digest"] = doc.digest
        yield g


def post(gw: Gateway, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, timeout=30, **kw)


def post_raw(
    gw: Gateway, content: bytes, path: str = "/v1/chat/completions", **headers: str
) -> httpx.Response:
    sent = {"content-type": "application/json", **headers}
    return httpx.post(gw.url + path, content=content, headers=sent, timeout=30)


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def chat(model_name: str, **extra: Any) -> dict[str, Any]:
    return {"model": model_name, "messages": [{"role": "user", "content": "hi"}], **extra}


def error_of(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert set(body) == {"error"}, f"not an OpenAI error: {body}"
    return dict(body["error"])


def requests_seen(*engines: Engine) -> int:
    return sum(e.stats()["requests"] for e in engines)


def no_traceback(gw: Gateway) -> None:
    assert "Traceback" not in gw.log(), gw.log()[-3000:]


# --- bodies that read differently to the gateway and to an engine ---------------------------


def test_json_nested_deeper_than_python_recurses_is_a_400_sentence(gw: Gateway) -> None:
    answer = post_raw(gw, b"[" * 100_000 + b"]" * 100_000)
    assert answer.status_code == 400, answer.text
    assert "nests" in error_of(answer)["message"]
    no_traceback(gw)


def test_a_deployed_plan_nested_too_deep_is_refused_with_422(gw: Gateway) -> None:
    answer = post_raw(gw, b"[" * 100_000 + b"]" * 100_000, "/admin/plan", **admin())
    assert answer.status_code == 422, answer.text
    assert "nests" in error_of(answer)["message"]
    no_traceback(gw)


def test_a_deployed_plan_with_a_lone_surrogate_is_refused_with_422(gw: Gateway, engine_a: Engine) -> None:
    doc = plan([model("m", [profile([engine_a.url], "m")], description="SURROGATE")])
    text = json.dumps(doc.doc).replace("SURROGATE", "\\ud800").encode()
    answer = post_raw(gw, text, "/admin/plan", **admin())
    assert answer.status_code == 422, answer.text
    assert "surrogate" in error_of(answer)["message"]
    no_traceback(gw)


def test_a_key_given_twice_is_refused_before_any_engine_sees_it(gw: Gateway, engine_a: Engine) -> None:
    before = requests_seen(engine_a)
    body = b'{"model": "chat-a", "messages": [], "max_tokens": 100000, "max_tokens": 5}'
    answer = post_raw(gw, body)
    assert answer.status_code == 400, answer.text
    error = error_of(answer)
    assert error["code"] == "duplicate_key" and "max_tokens" in error["message"], error
    assert requests_seen(engine_a) == before, "the engine may read the other max_tokens"


@pytest.mark.parametrize(
    "encoding", ["utf-16", "utf-32", "latin-1"], ids=["utf-16", "utf-32", "latin-1 text"]
)
def test_a_body_not_in_utf8_is_refused_not_forwarded(gw: Gateway, engine_a: Engine, encoding: str) -> None:
    before = requests_seen(engine_a)
    answer = post_raw(gw, json.dumps(chat("chat-a", user="José"), ensure_ascii=False).encode(encoding))
    assert answer.status_code == 400, answer.text
    assert "UTF-8" in error_of(answer)["message"]
    assert requests_seen(engine_a) == before


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n_predict"])
def test_every_token_limit_field_is_held_to_max_output(gw: Gateway, field: str) -> None:
    answer = post(gw, chat("chat-a", **{field: 101}))
    assert answer.status_code == 400, answer.text
    error = error_of(answer)
    assert error["param"] == field and "100" in error["message"], error
    assert post(gw, chat("chat-a", **{field: 100})).status_code == 200


def test_n_predict_minus_one_means_no_limit_so_only_models_without_one_take_it(gw: Gateway) -> None:
    assert post(gw, chat("chat-a", n_predict=-1)).status_code == 400, "chat-a has a max_output of 100"
    assert post(gw, chat("plain", n_predict=-1)).status_code == 200


# --- bodies cut short -----------------------------------------------------------------------


def send_and_hang_up(gw: Gateway, path: str, declared: int, sent: bytes, token: str | None = None) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + sent)
        time.sleep(0.2)


def logged_status(gw: Gateway, path: str, after: int) -> int | None:
    lines = [line for line in gw.access_lines()[after:] if line.get("path") == path]
    return lines[-1]["status"] if lines else None


def test_a_deploy_cut_short_is_a_client_error_not_a_refused_plan(gw: Gateway) -> None:
    seen = len(gw.access_lines())
    refusals = gw.log().count("refused a new plan")
    send_and_hang_up(gw, "/admin/plan", 1000, b'{"a', ADMIN)
    status = wait_until(lambda: logged_status(gw, "/admin/plan", seen), 10, "the deploy's access line")
    assert status == 400
    assert gw.log().count("refused a new plan") == refusals, "a client's hang-up is not a bad plan"


def test_a_request_cut_short_never_reaches_an_engine(gw: Gateway, engine_b: Engine) -> None:
    before = requests_seen(engine_b)
    seen = len(gw.access_lines())
    whole = json.dumps(chat("plain")).encode()  # valid JSON, but not all that was announced
    send_and_hang_up(gw, "/v1/chat/completions", len(whole) + 100, whole)
    status = wait_until(lambda: logged_status(gw, "/v1/chat/completions", seen), 10, "the access line")
    assert status == 400
    assert requests_seen(engine_b) == before, "a body cut short was sent on as if whole"


# --- what answers say about the engines behind them ------------------------------------------


def test_an_answer_names_the_model_the_client_asked_for(gw: Gateway, engine_a: Engine) -> None:
    answer = post(gw, chat("alias-a", fake_model="/models/weights/secret-Q4_K_M.gguf"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "alias-a", "the engine's own name reached the client"
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert engine_a.stats()["models_seen"][-1] == "served-a", "the engine is sent the name it serves"
    embedded = post(gw, {"model": "embed", "input": "x", "fake_model": "/w.gguf"}, "/v1/embeddings")
    assert embedded.json()["model"] == "embed"


def test_a_streamed_answer_names_the_model_the_client_asked_for(gw: Gateway) -> None:
    body = chat("alias-a", stream=True, fake_chunks=5, fake_model="/models/weights/secret.gguf")
    answer = post(gw, body)
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    assert len(events) == 5, answer.text
    assert {e["model"] for e in events} == {"alias-a"}, events
    assert "secret" not in answer.text


def test_every_answer_says_nosniff_and_json_answers_say_json(gw: Gateway) -> None:
    odd = post(gw, chat("plain", fake_content_type="text/html"))
    assert odd.status_code == 200
    assert odd.headers["content-type"] == "application/json", "an engine's odd type reached the client"
    streamed = post(gw, chat("plain", stream=True))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    answers = [
        odd,
        streamed,
        httpx.get(gw.url + "/v1/models", timeout=10),
        httpx.get(gw.url + "/healthz", timeout=10),
        httpx.get(gw.url + "/readyz", timeout=10),
        httpx.get(gw.url + "/metrics", headers=gw.probe_headers(), timeout=10),
        httpx.get(gw.url + "/", timeout=10),
        httpx.get(gw.url + "/nothing", timeout=10),
        post(gw, chat("no-such-model")),
        post_raw(gw, b"{"),
    ]
    for answer in answers:
        assert answer.headers.get("x-content-type-options") == "nosniff", (answer.url, answer.headers)


# --- probes and metrics ----------------------------------------------------------------------


def test_metrics_and_readyz_need_the_metrics_token_when_one_is_set(gw: Gateway) -> None:
    for path in ("/metrics", "/readyz"):
        bare = httpx.get(gw.url + path, timeout=10)
        assert bare.status_code == 401, f"{path} answered without the token"
        assert "LLMGW_METRICS_TOKEN" in error_of(bare)["message"]
        wrong = httpx.get(gw.url + path, headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        assert httpx.get(gw.url + path, headers=gw.probe_headers(), timeout=10).status_code == 200
    assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200, "liveness stays open"


def test_the_dashboard_hides_engines_from_a_caller_without_the_metrics_token(
    gw: Gateway, engine_a: Engine
) -> None:
    address = engine_a.url.removeprefix("http://")
    bare = httpx.get(gw.url + "/dashboard/status.json", timeout=10)
    assert bare.status_code == 200, "the page's counts stay open"
    assert address not in bare.text, f"status.json showed engine {address} without the token"
    assert bare.json()["engines_hidden"] is True
    assert address not in httpx.get(gw.url + "/dashboard", timeout=10).text
    shown = httpx.get(gw.url + "/dashboard/status.json", headers=gw.probe_headers(), timeout=10)
    assert address in shown.text, "the token's holder still sees the engines"


def test_metrics_drop_the_series_of_a_model_the_plan_no_longer_has(
    gw: Gateway, engine_a: Engine, engine_b: Engine
) -> None:
    for _ in range(4):
        assert post(gw, chat("retired")).status_code == 200
    metrics = httpx.get(gw.url + "/metrics", headers=gw.probe_headers(), timeout=10).text
    assert 'model="retired"' in metrics
    new = plan_on(engine_a.url, engine_b.url)
    deployed = httpx.post(gw.url + "/admin/plan", content=json.dumps(new.doc), headers=admin(), timeout=30)
    assert deployed.status_code == 200, deployed.text
    gw.every_worker(lambda ready: ready["digest"] == new.digest, 10, "the new plan")
    metrics = httpx.get(gw.url + "/metrics", headers=gw.probe_headers(), timeout=10).text
    assert 'model="retired"' not in metrics
    assert 'model="plain"' in metrics


# --- deploys ---------------------------------------------------------------------------------


def big_plan(engine: Engine) -> Plan:
    """About 10 MB: long enough to check that a worker doing it on its loop stalls (4.5 MB
    once was, until reading a plan became several times faster)."""
    return plan(
        [
            model(
                f"m{i}",
                [profile([engine.url], f"m{i}")],
                description="x" * 400,
                aliases=[f"a{i}-{j}" for j in range(20)],
            )
            for i in range(7000)
        ]
    )


def test_a_big_deploy_does_not_stall_the_workers_other_requests(tmp_path: Path, engine_a: Engine) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    text = json.dumps(big_plan(engine_a).doc).encode()
    with gateway(path, workers=1, LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_MAX_BODY_BYTES=str(32 << 20)) as gw:
        done: list[httpx.Response] = []

        def deploy() -> None:
            done.append(post_raw(gw, text, "/admin/plan", **admin()))

        deployer = threading.Thread(target=deploy)
        waits: list[float] = []
        with httpx.Client(timeout=30) as client:
            started = time.monotonic()
            deployer.start()
            while deployer.is_alive():
                asked = time.monotonic()
                client.get(gw.url + "/healthz")
                waits.append(time.monotonic() - asked)
        took = time.monotonic() - started
        deployer.join()
        assert done[0].status_code == 200, done[0].text
        assert took > 1.0, f"the deploy took {took:.2f}s, too little to tell"
        assert max(waits) < took / 2, (
            f"a request waited {max(waits):.2f}s of the deploy's {took:.2f}s: it was checked on the loop"
        )


def test_the_gateway_never_writes_through_a_symlink_at_its_own_files(
    tmp_path: Path, engine_a: Engine
) -> None:
    # Anyone who can write the plan's folder could point these names at another file, and
    # the gateway, writing its last good copy or a refusal, would overwrite that file.
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    victims = {}
    for name in (".plan.json.last-good", ".plan.json.refused"):
        victim = tmp_path / f"victim{name}"
        victim.write_text("precious\n")
        (tmp_path / name).symlink_to(victim)
        victims[name] = victim
    with gateway(path, LLMGW_ADMIN_TOKEN=ADMIN) as gw:
        refused = post_raw(gw, b'{"models": 5}', "/admin/plan", **admin())
        assert refused.status_code == 422, refused.text
        wait_until(lambda: "llmgw writes only files of its own" in gw.log(), 10, "the symlink to be refused")
        assert post(gw, chat("chat")).status_code == 200, "the gateway serves all the same"
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n", f"the gateway wrote through the symlink at {name}"
        assert (tmp_path / name).is_symlink()


def test_an_endpoint_pointing_at_the_gateway_itself_is_508_not_a_fan_out(
    tmp_path: Path, engine_a: Engine
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    # Health checks far apart: the looping replica stays in rotation for the whole test.
    with gateway(
        path, LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_HEALTH_INTERVAL="60", LLMGW_FIRST_BYTE_TIMEOUT="5"
    ) as gw:
        looped = plan([model("self", [profile([gw.url], "self")])])
        deployed = post_raw(gw, json.dumps(looped.doc).encode(), "/admin/plan", **admin())
        assert deployed.status_code == 200, deployed.text
        gw.every_worker(lambda ready: ready["digest"] == looped.digest, 10, "the looping plan")
        answer = post(gw, chat("self"))
        assert answer.status_code == 508, answer.text
        assert "points at the gateway" in error_of(answer)["message"]
        time.sleep(0.5)
        asked = [line for line in gw.access_lines() if line.get("model") == "self"]
        assert len(asked) <= 2, f"one request became {len(asked)}"


def local_address() -> str | None:
    """This machine's address on a network other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def run_deploy(plan_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "deploy", str(plan_path), "--gateway", url],
        env=subprocess_env(LLMGW_ADMIN_TOKEN=ADMIN),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_deploy_warns_when_the_token_would_cross_a_network_in_clear(tmp_path: Path, engine_a: Engine) -> None:
    address = local_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    new = tmp_path / "new.json"
    write_plan(new, plan([model("chat", [profile([engine_a.url], "chat2")])]))
    with gateway(path, workers=1, host=address, LLMGW_ADMIN_TOKEN=ADMIN) as gw:
        over_network = run_deploy(new, gw.url)
        assert over_network.returncode == 0, over_network.stderr
        assert "in clear" in over_network.stderr and "https" in over_network.stderr
    with gateway(path, workers=1, LLMGW_ADMIN_TOKEN=ADMIN) as gw:
        on_loopback = run_deploy(new, gw.url)
        assert on_loopback.returncode == 0, on_loopback.stderr
        assert "in clear" not in on_loopback.stderr


def test_an_error_repeats_at_most_a_short_prefix_of_what_the_client_sent(gw: Gateway) -> None:
    """A 7.5 MB model name once came back whole in its 404 (15 MB answered); a 5,000-character
    priority header in its 400."""
    named = post(gw, {"model": "m" * 200_000, "messages": [{"role": "user", "content": "hi"}]})
    assert named.status_code == 404 and len(named.content) < 2_000, len(named.content)
    assert "cut short; 200,000 characters" in named.json()["error"]["message"]
    header = post(
        gw,
        {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-llmgw-priority": "h" * 5000},
    )
    assert header.status_code == 400 and len(header.content) < 2_000, len(header.content)
