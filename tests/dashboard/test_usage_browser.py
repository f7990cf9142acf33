"""The usage figures and a key's page in headless Chromium, served by a real gateway with
two workers and fake engines: figures made of requests one worker served show on a page
either worker renders.

Screenshots land in artifacts/ (gitignored) for a person to look at after a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard import test_dashboard_browser as shared
from tests.dashboard.test_dashboard_browser import LIVE_TIMEOUT_MS, OVERFLOW, Page
from tests.gateway.harness import Gateway, engine, gateway, key_digest, model, plan, profile, write_plan

# The same Chromium, started once per module as the layout tests start it.
browser = shared.browser

ADMIN = "admin-secret"
TEAM = "sk-team-a"
KEYS = f"""keys:
  - name: team-a
    sha256: {key_digest(TEAM)}
    models: [chat]
    rpm: 600
    tpm: 100000
    expires: 2999-12-31
  - name: team-b
    sha256: {key_digest("sk-team-b")}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("usage")
    with engine("a", "127.0.0.2") as a:
        path = where / "plan.json"
        write_plan(
            path,
            plan(
                [
                    model("chat", [profile([a.url], "chat")], description="Answers questions."),
                    model("embed", [profile([a.url], "embed")], task="embedding", description="Vectors."),
                ]
            ),
        )
        keys = where / "keys.yaml"
        keys.write_text(KEYS)
        with gateway(path, workers=2, LLMGW_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN) as gw:
            with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TEAM}"}) as one:
                for i in range(8):  # one connection, so one worker serves them all
                    body = {
                        "model": "chat",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": i % 2 == 0,
                    }
                    assert one.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
            yield gw


def usage_cells(page: Page) -> dict[str, str]:
    row = page.page.locator('tr[data-usage-model="chat"]')
    return {cls: row.locator(f"td.{cls}").inner_text() for cls in ("rpm", "latency", "ttft", "tokens")}


def test_usage_figures_show_on_the_page_of_either_worker(browser: Any, served: Gateway) -> None:
    seen: dict[str, dict[str, str]] = {}
    for _ in range(20):  # a new context is a new connection: the kernel picks the worker
        page = Page(browser, served.url, 1280, 900)
        try:
            worker = page.page.locator("body").get_attribute("data-worker") or ""
            seen[worker] = usage_cells(page)
            assert page.page.evaluate(OVERFLOW) <= 0, "the usage table widens the page"
            assert page.errors == []
            if len(seen) == 1:
                page.screenshot("dashboard-usage.png")
        finally:
            page.close()
        if len(seen) >= 2:
            break
    assert len(seen) >= 2, f"twenty page loads reached only worker(s) {list(seen)}"
    for worker, cells in seen.items():
        assert cells["rpm"] != "0", f"worker {worker} shows no requests per minute: {cells}"
        assert cells["latency"].startswith("≈") and cells["ttft"].startswith("≈"), cells
        assert cells["tokens"] != "0", cells


def test_usage_figures_update_live_without_reloading(browser: Any, served: Gateway) -> None:
    page = Page(browser, served.url, 1280, 900)
    try:
        before = page.page.locator('tr[data-usage-model="embed"] td.rpm').inner_text()
        assert before == "0"
        with httpx.Client(timeout=30, headers={"Authorization": "Bearer sk-team-b"}) as client:
            for _ in range(3):
                answer = client.post(served.url + "/v1/embeddings", json={"model": "embed", "input": "x"})
                assert answer.status_code == 200, answer.text
        page.page.wait_for_function(
            """() => document.querySelector('tr[data-usage-model="embed"] td.rpm').textContent !== "0" """,
            timeout=LIVE_TIMEOUT_MS,
        )
        assert page.errors == []
    finally:
        page.close()


def test_the_usage_table_fits_a_phone(browser: Any, served: Gateway) -> None:
    page = Page(browser, served.url, 390, 844)
    try:
        assert page.page.evaluate(OVERFLOW) <= 0
        assert page.errors == []
        page.screenshot("dashboard-usage-phone.png")
    finally:
        page.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_a_keys_page_reads_well_for_the_admin_and_shows_no_key(
    browser: Any, served: Gateway, width: int
) -> None:
    context = browser.new_context(
        viewport={"width": width, "height": 900}, extra_http_headers={"Authorization": f"Bearer {ADMIN}"}
    )
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type in ("error", "warning") else None)
        answer = page.goto(served.url + "/dashboard/keys", wait_until="load")
        assert answer is not None and answer.status == 200
        page.locator('a[href="/dashboard/keys/team-a"]').click()
        page.wait_for_url("**/dashboard/keys/team-a")
        text = page.locator("body").inner_text()
        assert "team-a" in text and TEAM not in text and key_digest(TEAM) not in page.content()
        assert page.locator("#key-rpm").inner_text().endswith("of 600")
        assert page.locator("#key-tpm").inner_text().endswith("of 100,000")
        assert page.locator("#key-expires").inner_text() == "2999-12-31"
        assert page.locator('tr[data-model="chat"] td.requests').inner_text() == "8"
        assert page.evaluate(OVERFLOW) <= 0
        assert errors == []
        shared.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(shared.ARTIFACTS / f"dashboard-key-{width}.png"), full_page=True)
    finally:
        context.close()


def test_a_keys_page_without_the_admin_token_is_refused(browser: Any, served: Gateway) -> None:
    context = browser.new_context()
    try:
        answer = context.new_page().goto(served.url + "/dashboard/keys/team-a")
        assert answer is not None and answer.status == 401
    finally:
        context.close()
