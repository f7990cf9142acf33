"""Deploys and reloads under load, API keys, the admin token, and `llmgw deploy`/`serve`."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harness import (
    DIGEST_HEADER,
    ROOT,
    Engine,
    Gateway,
    Load,
    free_port,
    gateway,
    key_digest,
    model,
    plan,
    profile,
    stop,
    subprocess_env,
    wait_until,
    write_plan,
)
from harness import engine as start_engine

from llmgw.plan import Plan, plan_digest

ADMIN = "admin-secret"
KEY = "sk-test-key"


def plan_on(url: str, served: str = "chat") -> Plan:
    return plan(
        [
            model("chat", [profile([url], served)], aliases=["default"], max_output=512),
            model("embed", [profile([url], "embed")], task="embedding"),
        ]
    )


@contextlib.contextmanager
def _serve(where: Path, engine_a: Engine) -> Iterator[tuple[Gateway, Plan]]:
    doc = plan_on(engine_a.url)
    path = where / "plan.json"
    write_plan(path, doc)
    keys = where / "keys.txt"
    keys.write_text(f"# test keys\n{key_digest(KEY)}\n")
    with gateway(
        path, LLMGW_API_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_MAX_BODY_BYTES="65536"
    ) as gw:
        yield gw, doc


@pytest.fixture
def served(tmp_path: Path, engine_a: Engine) -> Iterator[tuple[Gateway, Plan]]:
    """A gateway of its own, for a test that replaces or refuses its plan."""
    with _serve(tmp_path, engine_a) as both:
        yield both


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[tuple[Gateway, Plan]]:
    """One gateway for the tests that only ask it (keys, tokens, spellings): its plan is never
    replaced, so each need not wait for a gunicorn of its own to start."""
    with _serve(tmp_path_factory.mktemp("steady"), engine_a) as both:
        yield both


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def _hammer(url: str) -> Load:
    """Clients sending requests the whole time a test runs, streamed and not; every answer must be a 200."""
    return Load(url, lambda n: {"model": "default", "messages": [], "stream": n % 2 == 0}, headers=auth())


def every_worker_serves(gw: Gateway, digest: str) -> None:
    # The promise is two seconds; the wait is longer so a loaded CI machine still passes.
    gw.every_worker(lambda ready: ready["digest"] == digest, 8, f"serving {digest}")


def refused(ready: dict[str, Any]) -> bool:
    return bool(ready["last_reload"]["result"] == "refused")


def test_a_replaced_plan_is_served_by_every_worker_and_no_request_fails(
    served: tuple[Gateway, Plan], engine_b: Engine
) -> None:
    gw, _ = served
    new = plan_on(engine_b.url, served="chat-on-b")
    with _hammer(gw.url) as hammer:
        write_plan(gw.plan_path, new)
        every_worker_serves(gw, new.digest)
        answer = httpx.post(
            gw.url + "/v1/chat/completions",
            headers=auth(),
            timeout=30,
            json={"model": "chat", "messages": []},
        )
        assert answer.json()["system_fingerprint"] == "b"
        assert "chat-on-b" in engine_b.stats()["models_seen"], "sent under the new plan's name"
        assert answer.headers[DIGEST_HEADER] == new.digest
    assert hammer.done > 0
    assert not hammer.failures, hammer.failures[:5]
    metrics = httpx.get(gw.url + "/metrics", timeout=10).text
    loaded = metric_value(metrics, "llmgw_plan_reloads_total", 'result="loaded"')
    assert loaded >= gw.workers, "each worker counts the reload it made"


def test_a_bad_plan_is_refused_and_the_old_one_keeps_serving(
    served: tuple[Gateway, Plan],
) -> None:
    gw, doc = served
    with _hammer(gw.url) as hammer:
        tampered = dict(doc.doc, models=doc.doc["models"][:1])  # digest no longer matches
        write_plan(gw.plan_path, tampered)
        # A worker that has not looked at the file yet also serves the old digest, so each
        # must say it refused the new one.
        answers = gw.every_worker(refused, 8, "the refused plan")
    for ready in answers.values():
        assert ready["digest"] == doc.digest, "the old plan keeps serving"
        assert "digest" in ready["last_reload"]["reason"]
    assert not hammer.failures, hammer.failures[:5]
    assert "refused a new plan" in gw.log()
    metrics = httpx.get(gw.url + "/metrics", timeout=10).text
    assert 'llmgw_plan_reloads_total{result="refused"}' in metrics


def test_a_deploy_refused_by_the_gateway_is_recorded_like_a_refused_plan_file(
    served: tuple[Gateway, Plan],
) -> None:
    gw, doc = served
    bad = dict(doc.doc, models=doc.doc["models"][:1])  # digest no longer matches
    answer = httpx.post(
        gw.url + "/admin/plan", json=bad, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 422, answer.text

    def a_worker_says_refused() -> dict[str, Any] | None:
        words = httpx.get(gw.url + "/readyz", timeout=10).json()["workers"]  # every worker's
        return next((word for word in words.values() if refused(word)), None)

    ready = wait_until(a_worker_says_refused, 15, "the worker that took the deploy to report it refused")
    assert "digest" in ready["last_reload"]["reason"] and ready["digest"] == doc.digest
    metrics = httpx.get(gw.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "llmgw_plan_reloads_total", 'result="refused"') == 1
    wait_until(lambda: "refused a new plan" in gw.log(), 10, "the refusal in the gateway's log")


def metric_value(text: str, name: str, label: str) -> float:
    """The sum of a metric's samples that carry `label`; 0 when there are none."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# Each passes the old schema; the first two pass the new one too, and only building the
# routes finds them out (httpx refuses the first, no socket takes the second's port).
UNROUTABLE = ("http://[::::::::::]:9000", "http://127.0.0.1:99999", "http://x:abc")


def plan_doc_on(endpoint: str) -> dict[str, Any]:
    """plan_on's document, for an endpoint the builder's own schema check may refuse: what
    is under test is that the gateway refuses it too, so the endpoint is put in afterwards."""
    placeholder = "http://127.0.0.1:9"
    doc: dict[str, Any] = json.loads(json.dumps(plan_on(placeholder).doc).replace(placeholder, endpoint))
    doc["digest"] = plan_digest(doc)
    return doc


def test_a_deploy_that_cannot_be_routed_is_refused_and_the_plan_file_kept(
    served: tuple[Gateway, Plan],
) -> None:
    gw, doc = served
    before = gw.plan_path.read_bytes()
    for endpoint in UNROUTABLE:
        answer = httpx.post(
            gw.url + "/admin/plan",
            json=plan_doc_on(endpoint),
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=10,
        )
        assert answer.status_code == 422, answer.text
        assert endpoint in answer.json()["error"]["message"], "the refusal names the endpoint"
        assert gw.plan_path.read_bytes() == before, "a restart must still find a plan it can serve"
    every_worker_serves(gw, doc.digest)


def test_a_plan_file_that_cannot_be_routed_is_refused_by_every_worker(
    served: tuple[Gateway, Plan], engine_b: Engine
) -> None:
    gw, doc = served
    write_plan(gw.plan_path, plan_on(UNROUTABLE[0]))
    answers = gw.every_worker(refused, 8, "the plan it cannot route")
    for ready in answers.values():
        assert ready["digest"] == doc.digest
        assert UNROUTABLE[0] in ready["last_reload"]["reason"]
    # The refusal must not leave the watcher deaf: the next plan still gets served.
    fixed = plan_on(engine_b.url)
    write_plan(gw.plan_path, fixed)
    every_worker_serves(gw, fixed.digest)


def test_a_request_in_flight_finishes_on_the_replica_it_started_on(
    served: tuple[Gateway, Plan], engine_a: Engine, engine_b: Engine
) -> None:
    gw, _ = served
    body = {"model": "chat", "messages": [], "stream": True, "fake_chunks": 8, "fake_chunk_delay": 0.4}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=auth(), timeout=30
    ) as answer:
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        write_plan(gw.plan_path, plan_on(engine_b.url))
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert len(rest) == 8, "seven more chunks and [DONE], all from the first replica"
    assert all('"system_fingerprint": "a"' in line for line in rest[:-1])


def test_v1_needs_a_listed_api_key(steady: tuple[Gateway, Plan]) -> None:
    gw, _ = steady
    url = gw.url + "/v1/models"
    assert httpx.get(url, timeout=10).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer sk-wrong"}, timeout=10)
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url, headers=auth(), timeout=10).status_code == 200
    assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200, "probes need no key"


def raw_request(
    url: str, method: str, target: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, str]:
    """One HTTP/1.1 request with the target sent byte for byte, as `curl --path-as-is` does:
    clients normalise `//v1` and `%2F`, attackers do not."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode("latin-1") + "\n\n" + rest.decode("utf-8", "replace")


# Every spelling of a /v1 path that once reached the API without a key (security issue, high).
ODD_SPELLINGS = [
    ("POST", "//v1/chat/completions", "chat"),
    ("POST", "///v1/embeddings", "embed"),
    ("GET", "/%2Fv1/models", None),
    ("POST", "/%2fv1/chat/completions", "chat"),
    ("GET", "http://h//v1/models", None),
]


@pytest.mark.parametrize(("method", "target", "model_name"), ODD_SPELLINGS)
def test_no_spelling_of_a_v1_path_skips_the_key_check(
    steady: tuple[Gateway, Plan], method: str, target: str, model_name: str | None
) -> None:
    gw, doc = steady
    body = b""
    if model_name == "chat":
        body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    elif model_name == "embed":
        body = json.dumps({"model": "embed", "input": "hi"}).encode()
    status, text = raw_request(gw.url, method, target, {}, body)
    assert status == 401, f"{method} {target} without a key was answered:\n{text}"
    assert '"authentication_error"' in text
    assert DIGEST_HEADER.lower() in text.lower(), "a refused API request still names the plan it met"
    status, text = raw_request(gw.url, method, target, {"Authorization": "Bearer sk-wrong"}, body)
    assert status == 401, f"{method} {target} with a wrong key was answered:\n{text}"
    status, text = raw_request(gw.url, method, target, auth(), body)
    assert status == 200, f"{method} {target} with the key: {text}"
    assert f"{DIGEST_HEADER.lower()}: {doc.digest}" in text.lower()


def test_odd_spellings_are_counted_in_the_request_metrics(steady: tuple[Gateway, Plan]) -> None:
    gw, _ = steady

    def refused_count() -> float:
        text = httpx.get(gw.url + "/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("llmgw_requests_total{") and 'status="401"' in line
        )

    # Two workers answer in turn, so send enough that both have counted some.
    before = refused_count()
    for _ in range(6):
        assert raw_request(gw.url, "GET", "//v1/models", {})[0] == 401
    wait_until(lambda: refused_count() >= before + 6, 10, what="the refused requests in /metrics")


@pytest.mark.parametrize("target", ["//admin/plan", "/%2Fadmin/plan", "http://h//admin/plan"])
def test_no_spelling_of_the_admin_path_skips_the_admin_token(
    steady: tuple[Gateway, Plan], target: str
) -> None:
    gw, doc = steady
    for headers in ({}, auth(), {"Authorization": "Bearer wrong"}):
        status, text = raw_request(gw.url, "GET", target, headers)
        assert status == 401, f"GET {target} with {headers} was answered:\n{text}"
        status, text = raw_request(gw.url, "POST", target, headers, json.dumps(doc.doc).encode())
        assert status == 401, f"POST {target} with {headers} was answered:\n{text}"
    status, text = raw_request(gw.url, "GET", target, {"Authorization": f"Bearer {ADMIN}"})
    assert status == 200, text


def test_the_bearer_scheme_is_case_insensitive(steady: tuple[Gateway, Plan]) -> None:
    gw, _ = steady
    for scheme in ("bearer", "BEARER"):
        key = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"}, timeout=10)
        assert key.status_code == 200, f"`{scheme} KEY` refused: {key.text}"
        admin = httpx.get(gw.url + "/admin/plan", headers={"Authorization": f"{scheme} {ADMIN}"}, timeout=10)
        assert admin.status_code == 200, f"`{scheme} TOKEN` refused: {admin.text}"


def test_metrics_forget_the_old_plans_digest_and_the_replicas_it_alone_listed(
    served: tuple[Gateway, Plan], engine_a: Engine, engine_b: Engine
) -> None:
    gw, doc = served
    new = plan_on(engine_b.url)
    write_plan(gw.plan_path, new)
    every_worker_serves(gw, new.digest)
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    assert any(
        line.startswith("llmgw_replica_healthy{") and engine_b.url in line for line in text.splitlines()
    ), "the replica the new plan lists is reported"
    stale = [
        line
        for line in text.splitlines()
        if (line.startswith("llmgw_replica_healthy{") and engine_a.url in line)
        or (line.startswith("llmgw_plan_info{") and doc.digest in line)
    ]
    assert not stale, f"series for what is no longer served: {stale}"


def test_admin_needs_the_admin_token(steady: tuple[Gateway, Plan]) -> None:
    gw, doc = steady
    for headers in ({}, auth(), {"Authorization": "Bearer wrong"}):
        answer = httpx.post(gw.url + "/admin/plan", json=doc.doc, headers=headers, timeout=10)
        assert answer.status_code == 401


def test_deploy_serves_a_good_plan_and_refuses_a_bad_one(
    served: tuple[Gateway, Plan], engine_b: Engine
) -> None:
    gw, doc = served
    new = plan_on(engine_b.url, served="deployed")
    new_path = gw.plan_path.with_name("new.json")
    write_plan(new_path, new)
    cli = [sys.executable, "-m", "llmgw", "deploy", str(new_path), "--gateway", gw.url]
    env = subprocess_env(LLMGW_ADMIN_TOKEN=ADMIN)
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert new.digest in done.stdout
    every_worker_serves(gw, new.digest)
    assert gw.plan_path.read_text() == new_path.read_text(), "the plan file itself is replaced"

    bad_path = gw.plan_path.with_name("bad.json")
    bad_path.write_text('{"format_version": "1"}')
    refused = subprocess.run(
        [*cli[:4], str(bad_path), *cli[5:]], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert refused.returncode != 0
    assert "refused" in refused.stderr and "schema" in refused.stderr
    assert httpx.get(gw.url + "/readyz", timeout=10).json()["digest"] == new.digest


def test_a_chunked_deploy_over_the_body_limit_is_413(steady: tuple[Gateway, Plan]) -> None:
    gw, doc = steady

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must be counted
        for _ in range(20):
            yield b" " * 8192

    answer = httpx.post(
        gw.url + "/admin/plan",
        content=chunks(),
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert answer.status_code == 413, answer.text
    assert "65536" in answer.json()["error"]["message"]
    assert httpx.get(gw.url + "/readyz", timeout=10).json()["digest"] == doc.digest


def test_the_official_openai_client_works_against_the_gateway(
    steady: tuple[Gateway, Plan],
) -> None:
    gw, _ = steady
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert {m.id for m in client.models.list()} == {"chat", "embed"}
    reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello from a"
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "tok0 tok1 tok2 "
    assert len(client.embeddings.create(model="embed", input=["a", "b"]).data) == 2
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[])
    with pytest.raises(openai.BadRequestError, match="512"):
        client.chat.completions.create(model="chat", messages=[], max_tokens=9999)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-bad", max_retries=0).models.list()


def _llmgw_serve(path: Path, port: int) -> subprocess.Popen[bytes]:
    argv = ["serve", "--plan", str(path), "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    return subprocess.Popen(
        [sys.executable, "-m", "llmgw", *argv],
        env=subprocess_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _ready(url: str) -> dict[str, Any]:
    answer = wait_until(lambda: httpx.get(url + "/readyz", timeout=2), 30, "llmgw serve to come up")
    return dict(answer.json())


def test_llmgw_serve_runs_the_gateway(tmp_path: Path) -> None:
    with start_engine("solo", "127.0.0.8") as solo:
        path = tmp_path / "plan.json"
        write_plan(path, plan_on(solo.url))
        port = free_port()
        proc = _llmgw_serve(path, port)
        try:
            url = f"http://127.0.0.1:{port}"
            _ready(url)
            answer = httpx.post(
                url + "/v1/chat/completions", timeout=30, json={"model": "chat", "messages": []}
            )
            assert answer.json()["system_fingerprint"] == "solo"
        finally:
            stop(proc)


def test_a_restart_after_a_bad_plan_file_serves_the_last_good_plan(tmp_path: Path) -> None:
    with start_engine("solo", "127.0.0.8") as solo:
        path = tmp_path / "plan.json"
        good = plan_on(solo.url)
        write_plan(path, good)
        url = f"http://127.0.0.1:{free_port()}"
        proc = _llmgw_serve(path, int(url.rsplit(":", 1)[1]))
        try:
            _ready(url)
        finally:
            stop(proc)
        path.write_text('{"format_version": "1"}')  # copied in by hand, say
        proc = _llmgw_serve(path, int(url.rsplit(":", 1)[1]))
        try:
            ready = _ready(url)
            assert ready["digest"] == good.digest
            assert ready["last_reload"]["result"] == "refused"
            assert "last good plan" in ready["last_reload"]["reason"]
            answer = httpx.post(
                url + "/v1/chat/completions", timeout=30, json={"model": "chat", "messages": []}
            )
            assert answer.status_code == 200
        finally:
            stop(proc)


def _serve_to_refusal(path: Path) -> subprocess.CompletedProcess[str]:
    """`llmgw serve` on a plan it must refuse: it exits before gunicorn starts."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "serve", "--plan", str(path), "--bind", f"127.0.0.1:{free_port()}"],
        env=subprocess_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_llmgw_serve_refuses_a_bad_plan_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{}")
    done = _serve_to_refusal(path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "llmgw plan" in done.stderr


def test_llmgw_serve_refuses_a_plan_it_cannot_route_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan_on(UNROUTABLE[0]))
    done = _serve_to_refusal(path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and UNROUTABLE[0] in done.stderr


def test_admin_get_plan_returns_the_served_plan_for_the_next_deploy(
    served: tuple[Gateway, Plan],
) -> None:
    gw, doc = served
    answer = httpx.get(gw.url + "/admin/plan", timeout=10, headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200
    assert answer.json() == doc.doc
    assert httpx.get(gw.url + "/admin/plan", timeout=10).status_code == 401
