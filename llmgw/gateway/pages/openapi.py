"""GET /openapi.json: an OpenAPI 3.1 description of the /v1 surface, errors included.

Written by hand rather than derived from the resources: what a client may rely on is a
promise, and a promise should change only when someone means it to. The request schemas
describe what the gateway itself checks (`model`, the length limits); everything else in
a body is the engine's business and passes through, so it is left open here too. Tests
run Schemathesis against a real gateway from this document (tests/gateway/test_openapi.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi

from llmgw.gateway.api import APIS, Api

_ERROR = {"$ref": "#/components/schemas/Error"}
_ANTHROPIC_ERROR = {"$ref": "#/components/schemas/AnthropicError"}

# Every status the gateway itself answers a /v1 request with, and when (see docs/gateway.md).
_ERRORS = {
    "400": "The body is not a JSON object with a `model`, a length limit is over the model's "
    "`max_output`, or the model was sent to the wrong endpoint.",
    "401": "An API key is missing or not accepted (only when the gateway has keys).",
    "404": "No model by that name or alias.",
    "413": "The body is over the gateway's limit.",
    "500": "Two replicas (or the only one) failed the request with a 500: the engine's own error.",
    "502": "No replica could answer, or an engine's answer was over the size limit.",
    "503": "No replica of the model is in rotation; see `Retry-After`.",
    "504": "The engine did not start answering within the first-byte timeout.",
}


def _errors(*codes: str, anthropic: bool = False) -> dict[str, Any]:
    schema = _ANTHROPIC_ERROR if anthropic else _ERROR
    return {
        code: {"description": _ERRORS[code], "content": {"application/json": {"schema": schema}}}
        for code in codes
    }


def _generation(
    answer: str, required: list[str], example: dict[str, Any], limits: tuple[str, ...], streams: bool
) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["model", *required],
        "properties": {
            "model": {
                "type": "string",
                "minLength": 1,
                "description": "A name or alias from GET /v1/models.",
            },
            **({"stream": {"type": "boolean"}} if streams else {}),
            **{
                field: {"type": "integer", "minimum": 1, "description": "At most the model's `max_output`."}
                for field in limits
            },
        },
        "additionalProperties": True,
        "description": f"Passed to the engine as sent, with `model` renamed to what it serves; {answer}",
        "example": example,
    }


_EVENTS = {
    "openai": "Server-sent events, `data: {...}` each, ending with `data: [DONE]`, or "
    'with `data: {"error": ...}` when the answer was cut off.',
    "responses": "Server-sent events, `event: response.*` and its `data: {...}` each, ending with "
    '`response.completed`, or with `data: {"error": ...}` when the answer was cut off.',
    "anthropic": "Server-sent events, from `message_start` to `message_stop`, or ending with "
    '`event: error` and `data: {"type": "error", ...}` when the answer was cut off.',
}


def _proxied(
    summary: str, request: str, answer: str, streams: bool, events: str = "openai", anthropic: bool = False
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{answer}"}}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}, "description": _EVENTS[events]}
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}},
            },
            "responses": {
                "200": {
                    "description": "The engine's answer, naming the model as the request did.",
                    "content": content,
                },
                **_errors("400", "401", "404", "413", "500", "502", "503", "504", anthropic=anthropic),
            },
        }
    }


_ANSWER = {
    "type": "object",
    "required": ["object"],
    "properties": {"object": {"type": "string"}, "model": {"type": "string"}},
}
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "context_length", "aliases", "task"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "description": {"type": "string"},
        "context_length": {"type": "integer"},
        "max_output": {"type": "integer"},
        "aliases": {"type": "array", "items": {"type": "string"}},
        "fallbacks": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Models that answer, in order, when this one cannot; absent: none.",
        },
        "task": {"enum": ["chat", "completion", "embedding", "rerank"]},
        "endpoints": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The paths that answer the model, e.g. /v1/chat/completions.",
        },
    },
}
# The other APIs' answers, as far as the gateway promises anything of them: their shape's
# marker, and the model renamed where they name one.
_RESPONSE = {
    "type": "object",
    "required": ["object"],
    "properties": {"object": {"const": "response"}, "model": {"type": "string"}},
}
_MESSAGE = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"const": "message"}, "model": {"type": "string"}},
}
_COUNT = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}}
_TOKENS = {"type": "object", "required": ["tokens"], "properties": {"tokens": {"type": "array"}}}
_RANKED = {
    "type": "object",
    "required": ["results"],
    "properties": {"model": {"type": "string"}, "results": {"type": "array"}},
}
_MESSAGES_EXAMPLE = {"model": "llama", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}
_CHAT_EXAMPLE = {"model": "llama", "messages": [{"role": "user", "content": "Hello"}]}


@dataclass(frozen=True)
class _Described:
    """What this page says of one API kind beside its row in gateway/api.py: the row gives the
    path, whether it streams, its length fields and its error shape."""

    summary: str
    request: str  # the request body's schema, by name
    answer: str  # the answer's schema, by name
    fields: str  # what the engine reads of the body, in a phrase
    required: list[str]
    example: dict[str, Any]


_DESCRIBED = {
    "chat": _Described(
        "A chat completion.",
        "ChatRequest",
        "Answer",
        "`messages` as OpenAI's API describes it.",
        ["messages"],
        _CHAT_EXAMPLE,
    ),
    "completion": _Described(
        "A completion of a raw prompt.",
        "CompletionRequest",
        "Answer",
        "`prompt` as OpenAI's API describes it.",
        ["prompt"],
        {"model": "llama", "prompt": "Hello"},
    ),
    "embedding": _Described(
        "Embeddings of the input.",
        "EmbeddingRequest",
        "Answer",
        "`input`, a string or a list of them.",
        ["input"],
        {"model": "embed", "input": "Hello"},
    ),
    "responses": _Described(
        "A response, in OpenAI's Responses API.",
        "ResponsesRequest",
        "Response",
        "`input` and `instructions` as OpenAI's Responses API describes them.",
        ["input"],
        {"model": "llama", "input": "Hello"},
    ),
    "messages": _Described(
        "A message, in Anthropic's Messages API; errors in Anthropic's shape, and the key may "
        "come as `x-api-key`.",
        "MessagesRequest",
        "Message",
        "`messages`, `system` and `max_tokens` as Anthropic's Messages API describes them.",
        ["max_tokens", "messages"],
        _MESSAGES_EXAMPLE,
    ),
    "count_tokens": _Described(
        "The tokens a Messages request's input would take (counts toward rpm, not tpm).",
        "CountTokensRequest",
        "TokenCount",
        "`messages` and `system` as Anthropic's count_tokens describes them.",
        ["messages"],
        _CHAT_EXAMPLE,
    ),
    "rerank": _Described(
        "Documents ranked by relevance to a query, for a `task: rerank` model.",
        "RerankRequest",
        "Ranked",
        "`query`, `documents` and `top_n`, as llama-server and vLLM take them.",
        ["query", "documents"],
        {"model": "rerank", "query": "What is a panda?", "documents": ["A bear.", "A car."]},
    ),
    "tokenize": _Described(
        "The engine's tokens of `content` (llama-server's /tokenize); counts toward rpm, not tpm.",
        "TokenizeRequest",
        "Tokens",
        "`content`, the text to tokenize, as llama-server takes it.",
        ["content"],
        {"model": "llama", "content": "Hello"},
    ),
}


def _path(api: Api) -> dict[str, Any]:
    said = _DESCRIBED[api.kind]
    return _proxied(
        said.summary, said.request, said.answer, api.streams, api.events, api.errors == "anthropic"
    )


def _request(api: Api) -> dict[str, Any]:
    said = _DESCRIBED[api.kind]
    return _generation(said.fields, said.required, said.example, api.length_fields, api.streams)


DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "llmgw",
        "version": "1",
        "description": "An OpenAI-compatible gateway for self-hosted models. Every error has "
        "OpenAI's shape (Anthropic's on /v1/messages) and a message that says what to do.",
    },
    "paths": {
        "/v1/models": {
            "get": {
                "summary": "The models served, with their aliases, task and limits.",
                "responses": {
                    "200": {
                        "description": "Every model.",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["object", "data"],
                                    "properties": {
                                        "object": {"const": "list"},
                                        "data": {
                                            "type": "array",
                                            "items": {"$ref": "#/components/schemas/Model"},
                                        },
                                    },
                                }
                            }
                        },
                    },
                    **_errors("401"),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "summary": "One model, by name or alias.",
                "parameters": [
                    {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {
                        "description": "The model.",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Model"}}},
                    },
                    **_errors("401", "404"),
                },
            }
        },
        **{api.path: _path(api) for api in APIS.values()},
    },
    "components": {
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["message", "type"],
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": ["string", "integer", "null"]},
                        },
                    }
                },
            },
            "AnthropicError": {
                "type": "object",
                "required": ["type", "error"],
                "properties": {
                    "type": {"const": "error"},
                    "error": {
                        "type": "object",
                        "required": ["type", "message"],
                        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            },
            "Model": _MODEL,
            "Answer": _ANSWER,
            "Response": _RESPONSE,
            "Message": _MESSAGE,
            "TokenCount": _COUNT,
            "Tokens": _TOKENS,
            "Ranked": _RANKED,
            **{_DESCRIBED[api.kind].request: _request(api) for api in APIS.values()},
        }
    },
}

_BODY = json.dumps(DOCUMENT, indent=1).encode()


class OpenApi:
    """GET /openapi.json. Open, like the dashboard: it says nothing a client could not learn."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = _BODY
