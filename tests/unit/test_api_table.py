"""The API table (llmgw/gateway/api.py) is what every part of the gateway reads: a kind added
there is served, described and refused in the right shape without a list elsewhere to update."""

from __future__ import annotations

from llmgw.gateway.api import APIS, LENGTH_FIELDS, answered_by
from llmgw.gateway.errors import _THE_API, speaks_anthropic
from llmgw.gateway.pages.openapi import DOCUMENT


def test_every_kind_is_described_in_openapi_with_its_length_fields() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    for api in APIS.values():
        assert api.path in DOCUMENT["paths"], f"{api.kind} is missing from /openapi.json"
        body = DOCUMENT["paths"][api.path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        properties = schemas[body["$ref"].rsplit("/", 1)[1]]["properties"]
        assert set(api.length_fields) <= set(properties), f"{api.kind}'s length fields are undocumented"


def test_a_request_s_own_limit_is_looked_for_in_every_kind_s_fields() -> None:
    assert LENGTH_FIELDS == ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")
    assert APIS["responses"].length_fields[0] == "max_output_tokens"
    assert not any(api.generates for api in APIS.values() if api.counts_only)


def test_a_chat_model_answers_chat_apis_and_an_embedding_model_only_embeddings() -> None:
    assert [a.kind for a in answered_by("chat")] == [
        "chat", "completion", "responses", "messages", "count_tokens", "tokenize"
    ]
    assert [a.kind for a in answered_by("embedding")] == ["embedding"]


def test_the_error_for_an_unknown_path_names_every_api_and_only_messages_speaks_anthropic() -> None:
    assert all(api.path in _THE_API for api in APIS.values())
    assert [api.kind for api in APIS.values() if speaks_anthropic(api.path)] == ["messages", "count_tokens"]
