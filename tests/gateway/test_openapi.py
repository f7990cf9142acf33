"""GET /openapi.json, and Schemathesis (a fuzzer that is not ours) against a real gateway
from that document: no 5xx from the gateway itself, and every answer as documented.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from harness import Engine, Gateway, gateway, model, plan, profile, write_plan
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine) -> Iterator[Gateway]:
    # The names the document's examples use, so its examples reach an engine.
    doc = plan(
        [
            model("llama", [profile([engine_a.url], "llama")]),
            model("embed", [profile([engine_b.url], "embed")], task="embedding"),
            model("rerank", [profile([engine_b.url], "rerank")], task="rerank"),
        ]
    )
    path = tmp_path_factory.mktemp("openapi") / "plan.json"
    write_plan(path, doc)
    with gateway(path, workers=1) as g:
        yield g


@pytest.fixture(scope="module")
def api_schema(gw: Gateway) -> Any:
    return schemathesis.openapi.from_url(gw.url + "/openapi.json")


def test_the_document_is_openapi_3_1_of_the_v1_surface(gw: Gateway) -> None:
    doc = httpx.get(gw.url + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/v1/tokenize",
    }
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "404", "413", "502", "503", "504"} <= set(chat), "errors must be in the document"
    messages = doc["paths"]["/v1/messages"]["post"]["responses"]["404"]["content"]["application/json"]
    assert messages["schema"] == {"$ref": "#/components/schemas/AnthropicError"}


# Driven by hand rather than through Schemathesis's pytest plugin, which does not load
# under the pytest this project pins.
@pytest.mark.timeout(120)
def test_the_gateway_answers_as_its_document_says(api_schema: Any) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def answers_as_documented(case: Any) -> None:
            case.call_and_validate(
                checks=[
                    not_a_server_error,
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
                timeout=10,
            )

        answers_as_documented()
