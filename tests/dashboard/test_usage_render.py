"""The usage table, the keys banner and the key pages, read from the HTML itself."""

from __future__ import annotations

from llmgw.gateway.pages.dashboard import DashboardSnapshot, render_key_page, render_page
from llmgw.gateway.state.rates import Figures, ModelFigures
from llmgw.plan import Plan
from tests.dashboard.html_tree import Node, parse
from tests.dashboard.plans import make_plan, sample_models

ENDPOINTS = [f"http://127.0.0.1:{9100 + i}" for i in range(6)]


def figures(**changes: object) -> ModelFigures:
    base: dict[str, object] = {
        "requests": 30,
        "rpm": 30.0,
        "tokens_per_second": 123.4,
        "prompt_tokens_per_second": 50.0,
        "latency_median": 1.234,
        "latency_over": False,
        "ttft_median": 0.1834,
        "ttft_over": False,
    }
    base.update(changes)
    return ModelFigures(**base)  # type: ignore[arg-type]


def page(usage: Figures | None, keys_refusal: str | None = None) -> Node:
    snap = DashboardSnapshot(
        plan=Plan.of(make_plan(sample_models(ENDPOINTS))),
        loaded_at=0.0,
        refusal=None,
        healthy={},
        keys_refusal=keys_refusal,
        usage=usage,
    )
    return parse(render_page(snap, now=60.0))


def usage_row(doc: Node, model: str) -> dict[str, str]:
    row = next(r for r in doc.find_all("tr") if r.attrs.get("data-usage-model") == model)
    return {c.attrs["data-label"] or "": c.text.strip() for c in row.find_all("td")}


def test_each_model_shows_its_last_minute_with_medians_marked_as_estimates() -> None:
    doc = page(Figures(60.0, {"llama-3.1-8b": figures()}))
    assert usage_row(doc, "llama-3.1-8b") == {
        "Requests/min": "30",
        "Median latency": "≈ 1.2 s",
        "Median time to first token": "≈ 183 ms",
        "Tokens/s": "123",
        "Waiting": "0",
    }
    assert "over the last 60 s" in doc.find("h2").text


def test_a_model_without_requests_shows_dashes_not_zero_latency() -> None:
    doc = page(Figures(60.0, {}))
    assert usage_row(doc, "nomic-embed") == {
        "Requests/min": "0",
        "Median latency": "–",
        "Median time to first token": "–",
        "Tokens/s": "0",
        "Waiting": "0",
    }


def test_a_median_past_the_last_bucket_says_at_least() -> None:
    doc = page(Figures(60.0, {"llama-3.1-8b": figures(latency_median=300.0, latency_over=True)}))
    assert usage_row(doc, "llama-3.1-8b")["Median latency"] == "> 300 s"


def test_before_the_first_reading_the_page_says_so() -> None:
    assert "first reading" in page(None).find("h2").text


def test_a_refused_keys_file_raises_its_banner_with_the_reason_as_text() -> None:
    doc = page(None, keys_refusal="keys.yaml: <b>bad</b>")
    banner = next(d for d in doc.find_all("div") if d.attrs.get("id") == "keys-refusal")
    assert "hidden" not in banner.attrs
    assert "<b>bad</b>" in banner.text


def test_a_key_page_shows_its_name_limits_and_usage_per_model() -> None:
    key = {
        "name": "team-a",
        "models": ["chat", "llama-*"],
        "rpm": 600,
        "tpm": 100000,
        "expires": "2020-01-31",
        "expired": True,
        "total": {"requests": 7},
        "last_minute": {"requests": 3, "tokens": 1500},
    }
    by_model = {
        "chat": {"requests": 5.0, "prompt_tokens": 30.0, "completion_tokens": 40.0},
        "x": {"requests": 2.0},
    }
    text = render_key_page(key, by_model)
    doc = parse(text)
    facts = {n.attrs["id"]: n.text for n in doc.find_all("dd")}
    assert facts["key-rpm"] == "3 used of 600" and facts["key-tpm"] == "1,500 used of 100,000"
    assert facts["key-expires"].startswith("2020-01-31 (expired")
    total = next(r for r in doc.find_all("tr") if "total" in (r.attrs.get("class") or ""))
    assert [c.text for c in total.find_all("td")] == ["7", "30", "40"]


def test_each_model_shows_the_requests_waiting_for_a_slot() -> None:
    snap = DashboardSnapshot(
        plan=Plan.of(make_plan(sample_models(ENDPOINTS))),
        loaded_at=0.0,
        refusal=None,
        healthy={},
        usage=Figures(60.0, {}),
        waiting={"llama-3.1-8b": 7},
    )
    doc = parse(render_page(snap, now=60.0))
    assert usage_row(doc, "llama-3.1-8b")["Waiting"] == "7"
    assert usage_row(doc, "nomic-embed")["Waiting"] == "0"
