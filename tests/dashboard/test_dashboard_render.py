"""What GET / and the status JSON say, read from the HTML and JSON themselves."""

from __future__ import annotations

import falcon.asgi
import falcon.testing
import pytest

from llmgw.gateway.pages.dashboard import (
    DashboardSnapshot,
    add_dashboard_routes,
    context_label,
    plan_view,
    relative_age,
    render_page,
    status_document,
)
from llmgw.plan import Plan
from tests.dashboard.html_tree import Node, parse
from tests.dashboard.plans import (
    HOSTILE_DESCRIPTION,
    bundled_plan,
    make_model,
    make_plan,
    make_profile,
    sample_models,
)

ENDPOINTS = [f"http://127.0.0.1:{9100 + i}" for i in range(6)]
LOADED_AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def snapshot(
    plan: Plan | None = None,
    *,
    refusal: str | None = None,
    healthy: dict[str, bool] | None = None,
) -> DashboardSnapshot:
    return DashboardSnapshot(
        plan=plan or make_plan(sample_models(ENDPOINTS)),
        loaded_at=LOADED_AT,
        refusal=refusal,
        healthy=healthy if healthy is not None else {},
    )


def page(snap: DashboardSnapshot, now: float = LOADED_AT + 300) -> Node:
    return parse(render_page(snap, now=now))


def model_groups(doc: Node) -> dict[str, Node]:
    return {g.attrs["data-model"] or "": g for g in doc.find_all("tbody", "model")}


def test_one_row_per_model_in_plan_order_with_the_facts_a_caller_picks_by() -> None:
    doc = page(snapshot(healthy={ENDPOINTS[0]: True, ENDPOINTS[1]: True}))
    groups = model_groups(doc)
    assert list(groups) == ["llama-3.1-8b", "qwen2.5-32b-long", "hostile", "nomic-embed"]
    row = groups["llama-3.1-8b"].find("tr", "model-row")
    cells = {c.attrs["data-label"]: c.text for c in row.children if isinstance(c, Node)}
    assert cells == {
        "Model": "llama-3.1-8b",
        "Aliases": "llama3, default",
        "Task": "chat",
        "Context": "8K",
        "Healthy": "2/2",
        "Engine profiles": "cpu llamacpp 2/2 prefix (0 hits, 0 spills)",
    }


def test_description_is_its_own_row_spanning_every_column_right_after_the_model_row() -> None:
    doc = page(snapshot())
    columns = len(doc.find("thead").find_all("th"))
    for name, group in model_groups(doc).items():
        rows = group.find_all("tr")
        assert [r.classes for r in rows] == [{"model-row"}, {"desc-row"}], name
        cells = rows[1].find_all("td")
        assert len(cells) == 1 and cells[0].attrs.get("colspan") == str(columns), (
            f"{name}: the description must be one cell spanning all {columns} columns"
        )
        assert not rows[0].find_all(cls="desc"), f"{name}: description leaked into a column"


def test_undescribed_model_says_so_in_muted_text_and_names_its_file() -> None:
    group = model_groups(page(snapshot()))["nomic-embed"]
    desc = group.find(cls="desc")
    assert "undescribed" in desc.classes
    assert desc.text.startswith("Undescribed")
    assert "catalog/nomic-embed.yaml" in desc.text


def test_described_model_is_not_marked_undescribed() -> None:
    desc = model_groups(page(snapshot()))["llama-3.1-8b"].find(cls="desc")
    assert "undescribed" not in desc.classes
    assert desc.text == "General chat, fast and cheap; the default for most requests."


def test_blank_description_reads_as_undescribed_not_as_empty() -> None:
    valid = make_plan([make_model("blank", [make_profile("cpu", ENDPOINTS[:1])])])
    # The schema refuses a blank description, so no builder makes one: the copy skips the
    # check, to show the page is not the only thing standing between it and a reader.
    blank = valid.model_copy(update={"models": (valid.models[0].model_copy(update={"description": "   "}),)})
    desc = model_groups(page(snapshot(blank)))["blank"].find(cls="desc")
    assert "undescribed" in desc.classes


def test_catalogue_markup_is_shown_as_text_never_as_elements() -> None:
    html = render_page(snapshot(refusal="<script>bad()</script> in fleet.yaml"), now=LOADED_AT)
    doc = parse(html)
    group = model_groups(doc)["hostile"]
    assert group.find(cls="desc").text == " ".join(HOSTILE_DESCRIPTION.split())
    assert group.find(cls="aliases").text == "<b>bold</b>"
    assert doc.by_id("refusal-reason").text == "<script>bad()</script> in fleet.yaml"
    # The page's own script file is the only script; the description's <img> is no element.
    assert [(s.attrs.get("src") or "").split("?")[0] for s in doc.find_all("script")] == [
        "/dashboard/static/dashboard.js"
    ]
    assert not doc.find_all("img") and not doc.find_all("b")
    assert "&lt;script&gt;window.__pwned" in html


def test_header_shows_digest_and_load_time_in_utc_and_relative() -> None:
    snap = snapshot()
    doc = page(snap, now=LOADED_AT + 300)
    assert doc.by_id("digest").text == snap.plan.digest
    loaded = doc.by_id("loaded-at")
    assert loaded.text == "2026-01-01T00:00:00Z" and loaded.attrs["datetime"] == loaded.text
    assert doc.by_id("age").text == "(5 min ago)"


def test_refusal_banner_is_hidden_after_a_successful_reload() -> None:
    banner = page(snapshot(refusal=None)).by_id("refusal")
    assert "hidden" in banner.attrs


def test_refusal_banner_gives_the_reason_when_the_last_reload_was_refused() -> None:
    reason = "plan.json says its digest is sha256:00… but its content hashes to sha256:11…"
    banner = page(snapshot(refusal=reason)).by_id("refusal")
    assert "hidden" not in banner.attrs
    assert banner.attrs.get("role") == "alert"
    assert reason in banner.text


def test_counting_limits_per_instance_while_redis_is_away_is_a_banner_with_the_reason() -> None:
    base = snapshot()
    assert "hidden" in page(base).by_id("limits-degraded").attrs
    reason = "Redis at redis://10.0.0.5:6379 failed (TimeoutError: Timeout reading from socket)"
    degraded = DashboardSnapshot(**{**base.__dict__, "limits_degraded": reason})
    banner = page(degraded).by_id("limits-degraded")
    assert "hidden" not in banner.attrs and banner.attrs.get("role") == "alert"
    assert reason in banner.text and "per instance" in banner.text
    assert status_document(degraded, plan_view(degraded.plan), LOADED_AT)["limits_degraded"] == reason


def test_health_counts_per_model_and_per_profile_and_a_replica_missing_from_the_map_is_not_counted() -> None:
    # ENDPOINTS[3] is missing from the health map (the gateway lists every replica; a map
    # without one must not count it as up).
    healthy = {ENDPOINTS[2]: True, ENDPOINTS[4]: False}
    groups = model_groups(page(snapshot(healthy=healthy)))
    qwen = groups["qwen2.5-32b-long"]
    assert qwen.find(cls="health").text == "1/2"
    profiles = [p.text for p in qwen.find_all("span", "profile")]
    assert profiles == [
        "gpu vllm 1/1 prefix (0 hits, 0 spills)",
        "cpu llamacpp 0/1 prefix (0 hits, 0 spills)",
    ]
    assert "some" in qwen.find(cls="health").find(cls="count").classes
    assert groups["hostile"].find(cls="health").text == "0/1"
    assert "none" in groups["hostile"].find(cls="health").find(cls="count").classes


def test_context_length_reads_as_k_when_a_power_of_two_with_exact_tokens_on_hover() -> None:
    ctx = model_groups(page(snapshot()))["qwen2.5-32b-long"].find(cls="context")
    assert ctx.text == "128K" and ctx.attrs["title"] == "131,072 tokens"
    assert context_label(1000) == "1,000"


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "just now"),
        (42, "42 s ago"),
        (300, "5 min ago"),
        (7200, "2 h ago"),
        (3 * 86400, "3 d ago"),
    ],
)
def test_relative_age(seconds: float, said: str) -> None:
    assert relative_age(seconds) == said


def test_a_new_plan_shows_new_models_although_pages_are_cached_by_digest() -> None:
    first = make_plan([make_model("first", [make_profile("cpu", ENDPOINTS[:1])])])
    second = make_plan([make_model("second", [make_profile("cpu", ENDPOINTS[:1])])])
    state = {"snap": snapshot(first)}
    client = falcon.testing.TestClient(_app(lambda: state["snap"]))
    assert "first" in model_groups(parse(client.simulate_get("/").text))
    state["snap"] = snapshot(second)
    assert list(model_groups(parse(client.simulate_get("/").text))) == ["second"]


def _app(snap) -> falcon.asgi.App:  # type: ignore[no-untyped-def]
    app = falcon.asgi.App()
    add_dashboard_routes(app, snap)
    return app


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_page_is_html_with_a_policy_that_runs_only_its_own_script(path: str) -> None:
    result = falcon.testing.TestClient(_app(snapshot)).simulate_get(path)
    assert result.status_code == 200
    assert list(model_groups(parse(result.text)))[0] == "llama-3.1-8b"
    assert result.headers["content-type"].startswith("text/html")
    csp = result.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_status_json_carries_health_refusal_and_digest_uncached() -> None:
    snap = snapshot(refusal="fleet.yaml: no such file", healthy={ENDPOINTS[0]: True})
    result = falcon.testing.TestClient(_app(lambda: snap)).simulate_get("/dashboard/status.json")
    assert result.status_code == 200
    assert result.headers["cache-control"] == "no-store"
    doc = result.json
    assert doc["digest"] == snap.plan.digest
    assert doc["refusal"] == "fleet.yaml: no such file"
    assert doc["loaded_at_utc"] == "2026-01-01T00:00:00Z"
    assert doc["models"]["llama-3.1-8b"] == {
        "healthy": 1,
        "placed": 2,
        "profiles": {
            "cpu": {
                "healthy": 1,
                "placed": 2,
                "routing": "prefix",
                "prefix_hits": 0,
                "prefix_spills": 0,
                "replicas": {},  # none ejected or on trial
            }
        },
    }
    assert len(result.text) < 2000, "the status polled every few seconds should stay small"


def test_assets_are_served_with_their_types_and_revalidate_by_etag() -> None:
    client = falcon.testing.TestClient(_app(snapshot))
    doc = parse(client.simulate_get("/").text)
    links = doc.find_all("link")
    hrefs = [n.attrs["href"] or "" for n in links if n.attrs.get("rel") == "stylesheet"]
    assert len(hrefs) == 1
    css = client.simulate_get(hrefs[0].split("?")[0])
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    js = client.simulate_get("/dashboard/static/dashboard.js")
    assert js.headers["content-type"].startswith("text/javascript")
    again = client.simulate_get(
        "/dashboard/static/dashboard.js", headers={"If-None-Match": js.headers["etag"]}
    )
    assert again.status_code == 304
    missing = client.simulate_get("/dashboard/static/nope.js")
    assert missing.status_code == 404 and "dashboard.js" in missing.json["description"]


def test_bundled_catalogue_renders_every_model_and_marks_the_undescribed_one() -> None:
    plan = bundled_plan()
    groups = model_groups(page(snapshot(plan)))
    assert list(groups) == [m.name for m in plan.models]
    undescribed = [n for n, g in groups.items() if "undescribed" in g.find(cls="desc").classes]
    assert undescribed == [m.name for m in plan.models if m.description is None]
    assert len(undescribed) == 1


def test_each_profile_shows_its_routing_and_prefix_hits_and_spills() -> None:
    snap = DashboardSnapshot(
        plan=make_plan(sample_models(ENDPOINTS)),
        loaded_at=LOADED_AT,
        refusal=None,
        healthy={},
        prefix={("llama-3.1-8b", "cpu"): (41, 3)},
    )
    groups = model_groups(page(snap))
    chat = groups["llama-3.1-8b"].find(cls="routing")
    assert chat.text == "prefix (41 hits, 3 spills)"
    embed = groups["nomic-embed"].find(cls="routing")
    assert embed.text == "least-loaded", "embeddings have no prefix to reuse"
    status = status_document(snap, plan_view(snap.plan), LOADED_AT)
    profile = status["models"]["llama-3.1-8b"]["profiles"]["cpu"]
    assert (profile["routing"], profile["prefix_hits"], profile["prefix_spills"]) == ("prefix", 41, 3)
