"""What the dashboard and /readyz say is the same whichever worker answers: the usage
figures (summed over every worker), a refused deploy, refused keys and the served plan.

/readyz answers for every worker; for the dashboard, each test asks with a fresh connection
until every worker has answered, since the kernel picks the worker, and checks each
worker's own answer.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, gateway, key_digest, model, plan, profile, wait_until, write_plan

ADMIN = "admin-secret"
TEAM = "sk-team-a"
KEYS = f"""keys:
  - name: team-a
    sha256: {key_digest(TEAM)}
    models: [chat]
    rpm: 600
    tpm: 100000
    expires: 2999-12-31
"""


@pytest.fixture
def served(tmp_path: Path, engine_a: Engine) -> Iterator[tuple[Gateway, dict[str, Any], Path]]:
    doc = plan(
        [
            model("chat", [profile([engine_a.url], "chat")]),
            model("embed", [profile([engine_a.url], "embed")], task="embedding"),
        ]
    )
    path = tmp_path / "plan.json"
    write_plan(path, doc)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    with gateway(path, workers=2, LLMGW_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN) as gw:
        yield gw, doc.doc, keys


def from_every_worker(
    gw: Gateway,
    path: str,
    worker_of: Callable[[httpx.Response], int],
    ready: Callable[[httpx.Response], bool],
    what: str,
    headers: dict[str, str] | None = None,
) -> dict[int, httpx.Response]:
    """Ask until each live worker has answered `ready`; its latest answer counts.

    Six connections at once each time: one after another, an idle gateway's connections
    went to the same worker nearly every time (the one the kernel wakes first), while a
    worker busy answering leaves the next connection to another."""
    latest: dict[int, httpx.Response] = {}

    def ask(_: int) -> httpx.Response:
        with httpx.Client(timeout=10) as fresh:
            return fresh.get(gw.url + path, headers=headers)

    def done() -> bool:
        with ThreadPoolExecutor(6) as pool:
            for answer in pool.map(ask, range(6)):
                latest[worker_of(answer)] = answer
        pids = gw.worker_pids()
        return len(pids) >= gw.workers and all(p in latest and ready(latest[p]) for p in pids)

    try:
        wait_until(done, 20, what)
    except AssertionError as exc:
        shown = {p: a.text[:2000] for p, a in latest.items()}
        raise AssertionError(f"{exc}\nworkers {gw.worker_pids()} answered {shown}") from None
    return latest


def status_worker(answer: httpx.Response) -> int:
    return int(answer.json()["worker"])


def page_worker(answer: httpx.Response) -> int:
    found = re.search(r'data-worker="(\d+)"', answer.text)
    assert found, "the dashboard does not say which worker rendered it"
    return int(found.group(1))


def test_requests_through_one_worker_show_in_the_usage_figures_of_every_worker(
    served: tuple[Gateway, dict[str, Any], Path],
) -> None:
    gw, _, _ = served
    headers = {"Authorization": f"Bearer {TEAM}"}
    with httpx.Client(timeout=30, headers=headers) as one:  # one connection: one worker
        sender = one.get(gw.url + "/dashboard/status.json").json()["worker"]
        for i in range(6):
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": i % 2 == 0}
            answer = one.post(gw.url + "/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text

    def counted(answer: httpx.Response) -> bool:
        return bool(answer.json()["usage"]["models"]["chat"]["requests"] == 6)

    answers = from_every_worker(gw, "/dashboard/status.json", status_worker, counted, "the six requests")
    assert sender in answers
    for pid, answer in answers.items():
        chat = answer.json()["usage"]["models"]["chat"]
        assert float(chat["rpm"]) > 0, f"worker {pid} shows no requests per minute: {chat}"
        assert chat["latency"].startswith("≈"), f"worker {pid} shows no median latency: {chat}"
        assert chat["ttft"].startswith("≈"), f"worker {pid} shows no time to first token: {chat}"
        assert float(chat["tokens_per_second"]) > 0, f"worker {pid} shows no tokens per second: {chat}"
        assert answer.json()["usage"]["models"]["embed"]["requests"] == 0

    pages = from_every_worker(
        gw, "/dashboard", page_worker, lambda a: "Median time to first token" in a.text, "the usage table"
    )
    for pid, page in pages.items():
        row = re.search(r'<tr data-usage-model="chat">(.*?)</tr>', page.text, re.S)
        assert row, f"worker {pid}'s page has no usage row for chat"
        cells = re.findall(r'<td class="num (\w+)"[^>]*>([^<]*)</td>', row.group(1))
        shown = dict(cells)
        assert shown["rpm"] != "0" and shown["latency"].startswith("≈") and shown["ttft"].startswith("≈"), (
            f"worker {pid}'s page shows {shown} for six requests"
        )


def test_a_keys_page_shows_its_limits_and_usage_to_the_admin_only_and_never_the_key(
    served: tuple[Gateway, dict[str, Any], Path],
) -> None:
    gw, _, _ = served
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TEAM}"}) as one:
        for _ in range(3):
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            assert one.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
    assert httpx.get(gw.url + "/dashboard/keys/team-a", timeout=10).status_code == 401
    wrong = {"Authorization": f"Bearer {TEAM}"}
    assert httpx.get(gw.url + "/dashboard/keys/team-a", headers=wrong, timeout=10).status_code == 401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for _ in range(6):  # fresh connections: both workers, most likely; each must agree
        with httpx.Client(timeout=10, headers=admin) as fresh:
            page = fresh.get(gw.url + "/dashboard/keys/team-a")
        assert page.status_code == 200, page.text
        text = page.text
        assert "team-a" in text and TEAM not in text and key_digest(TEAM) not in text
        assert re.search(r'<tr data-model="chat">.*?<td class="num requests"[^>]*>3</td>', text, re.S), text
        assert "3 used of 600" in text, "the last minute's requests against the rpm limit"
        assert "100,000" in text and "2999-12-31" in text
    listing = httpx.get(gw.url + "/dashboard/keys", headers=admin, timeout=10)
    assert listing.status_code == 200 and 'href="/dashboard/keys/team-a"' in listing.text
    missing = httpx.get(gw.url + "/dashboard/keys/nobody", headers=admin, timeout=10)
    assert missing.status_code == 404


def refused_on_readyz(word: dict[str, Any]) -> bool:
    return bool(word["last_reload"]["result"] == "refused")


def test_a_refused_deploy_is_reported_by_every_worker_on_readyz_and_the_dashboard(
    served: tuple[Gateway, dict[str, Any], Path],
) -> None:
    gw, doc, _ = served
    bad = dict(doc, models=doc["models"][:1])  # its digest no longer matches
    answer = httpx.post(
        gw.url + "/admin/plan", json=bad, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 422, answer.text
    reason = answer.json()["error"]["message"].split(": ", 1)[1]

    ready = gw.every_worker(refused_on_readyz, 20, "the refused deploy on /readyz")
    for pid, word in ready.items():
        assert word["digest"] == doc["digest"], f"worker {pid} serves another plan"
        assert word["last_reload"]["reason"] == reason, f"worker {pid} gives another reason"
    statuses = from_every_worker(
        gw,
        "/dashboard/status.json",
        status_worker,
        lambda a: a.json()["refusal"] == reason,
        "the refused deploy on the dashboard",
    )
    assert all(s.json()["digest"] == doc["digest"] for s in statuses.values())

    # A later plan that loads clears it everywhere.
    good = plan(
        [model("chat", [profile([doc["models"][0]["profiles"][0]["replicas"][0]["endpoint"]], "chat")])]
    )
    answer = httpx.post(
        gw.url + "/admin/plan", json=good.doc, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    gw.every_worker(
        lambda w: w["digest"] == good.digest and w["last_reload"]["result"] == "loaded",
        20,
        "the good plan, with no refusal",
    )


def test_a_refused_keys_file_is_reported_by_every_worker_and_its_dashboard(
    served: tuple[Gateway, dict[str, Any], Path],
) -> None:
    gw, _, keys = served
    tmp = keys.with_name(".keys.tmp")
    tmp.write_text("keys: [{name: broken}]\n")
    tmp.replace(keys)

    def keys_refused(word: dict[str, Any]) -> bool:
        return bool(word["keys"]["result"] == "refused")

    ready = gw.every_worker(keys_refused, 20, "the refused keys")
    reasons = {w["keys"]["reason"] for w in ready.values()}
    assert len(reasons) == 1, f"the workers give different reasons: {reasons}"
    from_every_worker(
        gw,
        "/dashboard",
        page_worker,
        lambda a: (
            "The last keys file was refused." in a.text
            and 'id="keys-refusal" class="banner" role="alert">' in a.text
        ),
        "the keys banner",
    )
    # A worker gunicorn starts now, in place of one that died, takes the last good keys and
    # says the same, rather than failing to boot (which stops the whole gateway).
    replaced = min(ready)
    os.kill(replaced, signal.SIGTERM)
    wait_until(lambda: replaced not in gw.worker_pids() and len(gw.worker_pids()) == 2, 30, "a new worker")
    again = gw.every_worker(keys_refused, 20, "the refused keys")
    assert replaced not in again
    assert {w["keys"]["reason"] for w in again.values()} == reasons
    assert gw.proc.poll() is None, f"the gateway stopped:\n{gw.log()}"
    # The old keys keep working.
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {TEAM}"},
        timeout=30,
        json={"model": "chat", "messages": []},
    )
    assert answer.status_code == 200, answer.text


def test_readyz_answers_for_every_worker_and_forgets_a_dead_one(
    served: tuple[Gateway, dict[str, Any], Path],
) -> None:
    """Any worker's /readyz holds every live worker's word: asking until each had answered
    could wait for good on a quiet machine, where the kernel gave one worker nearly every
    new connection."""
    gw, doc, _ = served
    workers = httpx.get(gw.url + "/readyz", timeout=10).json()["workers"]
    assert {int(p) for p in workers} == gw.worker_pids(), workers
    for word in workers.values():
        assert word["digest"] == doc["digest"] and word["last_reload"] == {"result": "loaded"}, word
    gone = min(gw.worker_pids())
    os.kill(gone, signal.SIGKILL)
    wait_until(lambda: gone not in gw.worker_pids() and len(gw.worker_pids()) == 2, 30, "a new worker")
    after = wait_until(
        lambda: _words_of(gw) if {int(p) for p in _words_of(gw)} == gw.worker_pids() else None,
        20,
        "the new worker's word",
    )
    assert str(gone) not in after, "the killed worker still speaks on /readyz"


def _words_of(gw: Gateway) -> dict[str, Any]:
    words: dict[str, Any] = httpx.get(gw.url + "/readyz", timeout=10).json()["workers"]
    return words
