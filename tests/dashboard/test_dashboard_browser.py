"""The dashboard in headless Chromium, served by a running gateway, measured as a user sees it.

Screenshots land in artifacts/ (gitignored) for a person to look at after a run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.gateway.pages.dashboard import POLL_SECONDS
from llmgw.plan import Plan, dump_plan
from tests.dashboard.plans import (
    HOSTILE_DESCRIPTION,
    bundled_plan,
    endpoints_of,
    make_model,
    make_plan,
    make_profile,
    repoint,
    sample_models,
)
from tests.dashboard.upstream import FakeUpstream

playwright_sync = pytest.importorskip("playwright.sync_api")

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The page polls every 5 s and the gateway needs a few failed checks to take a
# replica out; this is how long a user might wait to see a change.
LIVE_TIMEOUT_MS = 15_000
# The browser is served the same page with a poll of 0.4 s: the page reads its interval from
# its body's data-poll-ms, and what these tests check (counts and banners changing in place,
# counts marked stale) is the script's doing at any interval. Waiting out 5 s polls, two or
# three of them a test, was most of this module's minute.
QUICK_POLL = (f'data-poll-ms="{POLL_SECONDS * 1000}"', 'data-poll-ms="400"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_plan(path: Path, plan: Plan | str) -> None:
    text = plan if isinstance(plan, str) else dump_plan(plan.doc)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class Gateway:
    def __init__(self, plan_path: Path, upstreams: list[FakeUpstream], log: Path) -> None:
        self.plan_path = plan_path
        self.upstreams = upstreams
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "LLMGW_PLAN": str(plan_path),
            "LLMGW_HEALTH_INTERVAL": "0.3",
            "LLMGW_HEALTH_FAILURES": "1",
            "LLMGW_RELOAD_INTERVAL": "0.2",
        }
        # One worker, so every poll sees the same health view as the last.
        command = [
            sys.executable, "-m", "llmgw", "serve", "--plan", str(plan_path),
            "--bind", f"127.0.0.1:{self.port}", "--workers", "1",
        ]
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_until_serving(log)

    def _wait_until_serving(self, log: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the gateway exited:\n{log.read_text()}")
            try:
                if httpx.get(self.url + "/", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the gateway did not serve / within 60 s:\n{log.read_text()}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    upstreams = [FakeUpstream() for _ in range(6)]
    where = tmp_path_factory.mktemp("gateway")
    plan = make_plan(sample_models([u.endpoint for u in upstreams]))
    write_plan(where / "plan.json", plan)
    gw = Gateway(where / "plan.json", upstreams, where / "gateway.log")
    try:
        yield gw
    finally:
        gw.close()
        for u in upstreams:
            u.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (.ci/run installs Debian's chromium)")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A loaded dashboard that remembers every script error and console error it saw."""

    def __init__(self, browser: Any, url: str, width: int, height: int) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"script error: {exc}"))
        self.page.on("console", self._console)
        self.page.on("dialog", self._dialog)
        self.page.route(url + "/", self._poll_quicker)
        self.page.goto(url + "/", wait_until="load")

    @staticmethod
    def _poll_quicker(route: Any) -> None:
        answer = route.fetch()
        html = answer.text()
        assert QUICK_POLL[0] in html, "the dashboard no longer says its poll interval in data-poll-ms"
        route.fulfill(response=answer, body=html.replace(*QUICK_POLL))

    def _console(self, msg: Any) -> None:
        # CSP violations and failed loads arrive as console errors, not page errors.
        if msg.type in ("error", "warning"):
            self.errors.append(f"console {msg.type}: {msg.text}")

    def _dialog(self, dialog: Any) -> None:
        self.errors.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / name), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def desktop(browser: Any, gateway: Gateway) -> Iterator[Page]:
    page = Page(browser, gateway.url, 1280, 900)
    yield page
    page.close()


@pytest.fixture
def phone(browser: Any, gateway: Gateway) -> Iterator[Page]:
    page = Page(browser, gateway.url, 390, 844)
    yield page
    page.close()


# Lines are counted from the text's own boxes: boxes whose tops are within half a
# line of each other sit on one line (code and prose differ by a pixel or two).
MEASURE = """() => {
  const table = document.querySelector("table.models");
  const t = table.getBoundingClientRect();
  const lines = (el) => {
    const range = document.createRange();
    range.selectNodeContents(el);
    const tops = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0)
      .map(r => r.top).sort((a, b) => a - b);
    const half = parseFloat(getComputedStyle(el).fontSize) * 0.6;
    return tops.filter((top, i) => i === 0 || top - tops[i - 1] > half).length;
  };
  return [...document.querySelectorAll("tbody.model")].map(group => {
    const row = group.querySelector("tr.model-row");
    const desc = group.querySelector("tr.desc-row");
    const cell = desc.querySelector("td");
    const r = row.getBoundingClientRect(), d = desc.getBoundingClientRect();
    const c = cell.getBoundingClientRect();
    return {
      name: group.dataset.model, rowBottom: r.bottom, rowHeight: r.height,
      descTop: d.top, descLines: lines(cell), cellLeft: c.left, cellRight: c.right,
      tableLeft: t.left, tableRight: t.right, colSpan: cell.colSpan,
      columns: table.querySelectorAll("thead th").length,
      cellLines: Object.fromEntries([...row.children].map(el => [el.dataset.label, lines(el)])),
    };
  });
}"""

# Where each column starts and how wide it is, from the header cells.
COLUMNS = """() => [...document.querySelectorAll("table.models thead th")]
  .map(th => { const r = th.getBoundingClientRect(); return [Math.round(r.left), Math.round(r.width)]; })"""

OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"


def test_each_description_sits_directly_under_its_model_row_spanning_every_column(
    desktop: Page,
) -> None:
    rows = desktop.page.evaluate(MEASURE)
    desktop.screenshot("dashboard.png")
    assert [r["name"] for r in rows] == [
        "llama-3.1-8b", "qwen2.5-32b-long", "hostile", "nomic-embed"
    ]
    for r in rows:
        name = r["name"]
        assert abs(r["descTop"] - r["rowBottom"]) < 0.5, (
            f"{name}: description starts at {r['descTop']}px, its row ends at {r['rowBottom']}px"
        )
        assert r["colSpan"] == r["columns"], f"{name}: description spans {r['colSpan']} columns"
        left, right = r["cellLeft"] - r["tableLeft"], r["cellRight"] - r["tableRight"]
        assert abs(left) < 1 and abs(right) < 1, f"{name}: description is narrower than the table"
    assert desktop.errors == []


def test_a_long_description_wraps_in_its_own_row_and_never_wraps_the_columns(
    desktop: Page,
) -> None:
    rows = {r["name"]: r for r in desktop.page.evaluate(MEASURE)}
    long, short = rows["qwen2.5-32b-long"], rows["llama-3.1-8b"]
    assert long["descLines"] >= 3, "the long description should wrap over several lines"
    for r in rows.values():
        wrapped = {col: n for col, n in r["cellLines"].items() if n != 1}
        assert not wrapped, f"{r['name']}: these columns wrapped onto several lines: {wrapped}"
    assert abs(long["rowHeight"] - short["rowHeight"]) < 2, (
        f"the row with a long description is {long['rowHeight']}px tall, a short one "
        f"{short['rowHeight']}px: the description is stretching its model row"
    )
    before = desktop.page.evaluate(COLUMNS)
    desktop.page.evaluate("() => document.querySelectorAll('.desc').forEach(d => d.textContent = 'x')")
    assert desktop.page.evaluate(COLUMNS) == before, (
        "the columns moved when the descriptions got shorter: descriptions are sizing columns"
    )
    assert desktop.page.evaluate(OVERFLOW) <= 0, "the page scrolls sideways on a desktop"


def test_catalogue_markup_shows_as_text_and_no_script_of_it_runs(desktop: Page) -> None:
    hostile = desktop.page.locator('tbody[data-model="hostile"]')
    assert hostile.locator(".desc").inner_text() == HOSTILE_DESCRIPTION
    assert hostile.locator(".aliases").inner_text() == "<b>bold</b>"
    assert desktop.page.evaluate("() => window.__pwned") is None
    assert desktop.page.locator("main img, main b").count() == 0
    assert desktop.errors == []


def test_undescribed_model_says_so_in_the_muted_colour(desktop: Page) -> None:
    undescribed = desktop.page.locator('tbody[data-model="nomic-embed"] .desc')
    described = desktop.page.locator('tbody[data-model="llama-3.1-8b"] .desc')
    assert undescribed.inner_text().startswith("Undescribed")
    color = "el => getComputedStyle(el).color"
    muted = desktop.page.locator(".muted").first.evaluate(color)
    assert undescribed.evaluate(color) == muted
    assert described.evaluate(color) != muted, "a described model should not look muted"


def test_phone_width_has_no_sideways_scroll_and_keeps_descriptions_under_their_models(
    phone: Page,
) -> None:
    phone.screenshot("dashboard-phone.png")
    assert phone.page.evaluate(OVERFLOW) <= 0, "the page scrolls sideways at 390px"
    for r in phone.page.evaluate(MEASURE):
        assert abs(r["descTop"] - r["rowBottom"]) < 0.5, f"{r['name']}: description drifted"
    font = phone.page.locator("tbody.model .desc").first.evaluate(
        "el => parseFloat(getComputedStyle(el).fontSize)"
    )
    assert font >= 14, f"descriptions are {font}px on a phone: too small to read"
    assert phone.errors == []


def _health(page: Page, model: str) -> str:
    return str(page.page.locator(f'tbody[data-model="{model}"] td.health').inner_text())


def _wait_for_health(page: Page, model: str, text: str) -> None:
    page.page.wait_for_function(
        "([m, t]) => document.querySelector(`tbody[data-model=\"${m}\"] td.health`)"
        ".textContent.trim() === t",
        arg=[model, text],
        timeout=LIVE_TIMEOUT_MS,
    )


def test_replica_health_updates_live_without_reloading(desktop: Page, gateway: Gateway) -> None:
    _wait_for_health(desktop, "llama-3.1-8b", "2/2")
    desktop.page.evaluate("() => { window.__same_page = true; }")
    gateway.upstreams[1].healthy = False
    try:
        _wait_for_health(desktop, "llama-3.1-8b", "1/2")
        profile = desktop.page.locator('tbody[data-model="llama-3.1-8b"] [data-profile="cpu"]')
        assert profile.locator(".count").inner_text() == "1/2", profile.inner_text()
    finally:
        gateway.upstreams[1].healthy = True
    _wait_for_health(desktop, "llama-3.1-8b", "2/2")
    assert desktop.page.evaluate("() => window.__same_page") is True, "the page reloaded"
    assert desktop.errors == []


def test_refused_reload_raises_a_banner_with_the_reason_and_a_good_one_clears_it(
    desktop: Page, gateway: Gateway
) -> None:
    banner = desktop.page.locator("#refusal")
    assert banner.is_hidden()
    good = gateway.plan_path.read_text()
    write_plan(gateway.plan_path, "{this is not a plan")
    try:
        banner.wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
        assert "not valid JSON" in banner.inner_text()
        desktop.screenshot("dashboard-refused.png")
    finally:
        write_plan(gateway.plan_path, good)
    banner.wait_for(state="hidden", timeout=LIVE_TIMEOUT_MS)
    assert desktop.errors == []


def test_a_new_plan_being_served_is_announced_rather_than_mixed_into_the_old_page(
    desktop: Page, gateway: Gateway
) -> None:
    notice = desktop.page.locator("#plan-changed")
    assert notice.is_hidden()
    good = gateway.plan_path.read_text()
    endpoint = gateway.upstreams[0].endpoint
    other = make_plan([make_model("other", [make_profile("cpu", [endpoint])])])
    write_plan(gateway.plan_path, other)
    try:
        notice.wait_for(state="visible", timeout=LIVE_TIMEOUT_MS)
    finally:
        write_plan(gateway.plan_path, good)
    desktop.page.reload()
    notice.wait_for(state="hidden", timeout=LIVE_TIMEOUT_MS)
    assert desktop.errors == []


def test_bundled_catalogue_reads_well_and_is_the_readme_screenshot(
    browser: Any, tmp_path: Path
) -> None:
    plan = bundled_plan()
    endpoints = endpoints_of(plan)
    upstreams = [FakeUpstream() for _ in endpoints]
    # One replica down, so the screenshot shows what partial health looks like.
    upstreams[1].healthy = False
    plan = repoint(plan, {e: u.endpoint for e, u in zip(endpoints, upstreams, strict=True)})
    write_plan(tmp_path / "plan.json", plan)
    gw = Gateway(tmp_path / "plan.json", upstreams, tmp_path / "gateway.log")
    page = None
    try:
        _wait_for_status(gw, lambda s: sum(m["healthy"] for m in s["models"].values())
                         == len(endpoints) - 1)
        page = Page(browser, gw.url, 1280, 800)
        page.screenshot("dashboard-catalogue.png")
        rows = page.page.evaluate(MEASURE)
        assert [r["name"] for r in rows] == [m.name for m in plan.models]
        for r in rows:
            assert abs(r["descTop"] - r["rowBottom"]) < 0.5, f"{r['name']}: description drifted"
            wrapped = {col: n for col, n in r["cellLines"].items() if n != 1}
            assert not wrapped, f"{r['name']}: columns wrapped: {wrapped}"
        undescribed = page.page.locator(".desc.undescribed")
        assert undescribed.count() == 1
        assert page.page.evaluate(OVERFLOW) <= 0
        assert page.errors == []
    finally:
        if page is not None:
            page.close()
        gw.close()
        for u in upstreams:
            u.close()


def _wait_for_status(gw: Gateway, ready: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready(httpx.get(gw.url + "/dashboard/status.json", timeout=2).json()):
            return
        time.sleep(0.1)
    raise AssertionError("the gateway's health never settled to what the upstreams answer")


def test_a_gateway_that_stops_answering_is_shown_as_stale_counts(
    browser: Any, gateway: Gateway
) -> None:
    page = Page(browser, gateway.url, 1280, 900)
    try:
        live = page.page.locator("#live")
        assert "stale" not in live.inner_text()
        page.page.route("**/dashboard/status.json", lambda route: route.abort())
        page.page.wait_for_function(
            "() => document.getElementById('live').classList.contains('stale')",
            timeout=LIVE_TIMEOUT_MS,
        )
        assert "may be stale" in live.inner_text()
        page.page.unroute("**/dashboard/status.json")
        page.page.wait_for_function(
            "() => !document.getElementById('live').classList.contains('stale')",
            timeout=LIVE_TIMEOUT_MS,
        )
    finally:
        page.close()
