"""Reading and checking a request's body before any replica is bothered: its size, one
reading of its JSON (the one every engine makes), its model's endpoint and output limit."""

from __future__ import annotations

import json
from typing import Any

import falcon.asgi

from llmgw.gateway.api import APIS, LENGTH_FIELDS, answered_by
from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.usage import Meter
from llmgw.gateway.state.routes import Model


async def read_body(req: falcon.asgi.Request, limit: int, too_large: str) -> bytes:
    """The whole body; 413 saying `too_large` once it is over `limit` bytes, declared or not;
    400 when the client left before sending all of it."""
    length = req.content_length
    if length is not None and length > limit:
        raise ApiError(413, too_large, code="request_too_large")
    if length is not None:
        body = bytes(await req.stream.read())
    else:
        parts, total = [], 0  # chunked upload: count as it comes
        async for part in req.stream:
            total += len(part)
            if total > limit:
                raise ApiError(413, too_large, code="request_too_large")
            parts.append(part)
        body = b"".join(parts)
    # The server ends the stream when the client goes away, and the part that came looks
    # like a whole body: a deploy cut short was refused as a bad plan, and a request cut
    # at the right place went to an engine.
    body_watch = req.scope.get("llmgw.body")
    if (length is not None and len(body) < length) or (body_watch is not None and body_watch.cut):
        announced = f" of the {length} its Content-Length announced" if length is not None else ""
        raise ApiError(
            400,
            f"The request body was cut short: the connection closed after {len(body)} bytes"
            f"{announced}. Send the whole body again.",
            code="body_cut_short",
        )
    return body


def ask_for_usage(request: dict[str, Any]) -> tuple[dict[str, Any], Meter]:
    """A stream's request asking the engine for usage (a new dict when it changes); and the
    meter that takes the usage event out again when the client did not ask for it."""
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return request, Meter()
    given = options if isinstance(options, dict) else {}
    asked = {**request, "stream_options": {**given, "include_usage": True}}
    return asked, Meter(strip_usage_event=True)


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)
    raise AssertionError("unreachable: fewer keys than pairs means one repeats")


# Made once: json.loads with a hook builds a decoder and its scanner on every call.
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def parse_request(body: bytes) -> dict[str, Any]:
    # One reading of the body, the same one every engine makes: the gateway checks the
    # body it parsed and forwards the bytes, so bytes an engine could read differently
    # (another encoding, a key given twice) must not pass.
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ApiError(
            400, "The request body is not UTF-8; send JSON encoded as UTF-8, as the OpenAI API expects."
        ) from None
    try:
        request = _DECODER.decode(text)
    except _RepeatedKey as exc:
        raise ApiError(
            400,
            f"The request body gives `{exc}` more than once in one object; engines differ on which "
            "one counts, so send each field once.",
            param=str(exc),
            code="duplicate_key",
        ) from None
    except RecursionError:
        raise ApiError(
            400, "The request body nests arrays or objects too deeply to read; no API request needs that."
        ) from None
    except ValueError as exc:
        raise ApiError(400, f"The request body is not valid JSON ({exc}).") from None
    if not isinstance(request, dict):
        raise ApiError(400, 'The request body must be a JSON object, e.g. {"model": ...}.')
    model = request.get("model")
    if model is None or model == "":
        raise ApiError(400, "The request has no `model`; name one from GET /v1/models.", param="model")
    if not isinstance(model, str):
        raise ApiError(400, "`model` must be a string: a name from GET /v1/models, in quotes.", param="model")
    stream = request.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # `"stream": 1` streams on every engine, while the gateway, reading it as no stream,
        # neither asked for usage nor timed it as one: its tokens went uncounted.
        raise ApiError(400, "`stream` must be true or false.", param="stream")
    return request


def wrong_endpoint(model: Model, path: str) -> ApiError:
    paths = [api.path for api in answered_by(model.task)]
    right = " or ".join(paths) if len(paths) < 3 else ", ".join(paths[:-1]) + " or " + paths[-1]
    return ApiError(
        400,
        f"'{model.name}' is {_article(model.task)} {model.task} model; send it to POST {right}, not {path}.",
        param="model",
        code="wrong_endpoint",
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


# Every kind's length fields are checked on every request (api.LENGTH_FIELDS): checking only
# the OpenAI ones let llama.cpp's `n_predict` past max_output.


def output_limit(model: Model, kind: str, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The request with the model's `max_output` as its answer's limit when it sets none of
    its own (a request without one, with `ignore_eos`, ran until the context was full): a new
    dict then, in each API's own field (the Responses API's `max_output_tokens`); and the most
    tokens its answer may have, None when nothing bounds it: the largest of the fields its
    engine obeys, at most `max_output`. Reserving by the first field given let
    `{"max_tokens": 1, "n_predict": 500}` reserve 1 token and write 500. Requests that
    generate nothing (embeddings, rerank, counting) get no limit."""
    fields = APIS[kind].length_fields
    if not fields:
        return request, None
    given = [value for field in fields if (value := request.get(field)) is not None]
    if any(not isinstance(v, int) or v < 1 for v in given):
        return request, None  # n_predict -1: allowed only where the model sets no limit
    if given:
        most = max(given)
        return request, most if model.max_output is None else min(most, model.max_output)
    if model.max_output is None:
        return request, None
    return {**request, fields[0]: model.max_output}, model.max_output


def capped_for(model: Model, kind: str, request: dict[str, Any]) -> dict[str, Any]:
    """The request as `model` would take it as a fallback: every length field it set above the
    model's `max_output` (or -1, no limit) lowered to it, and the limit written in when it set
    none. Sent as it was, a 3,000-token ask reached a fallback whose max_output is 100, one
    it would have refused itself."""
    limit = model.max_output
    fields = APIS[kind].length_fields
    if limit is None or not fields:
        return request
    capped = dict(request)
    for field in fields:
        value = capped.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and (value > limit or value == -1):
            capped[field] = limit
    if not any(capped.get(field) is not None for field in fields):
        capped[fields[0]] = limit
    return capped


def check_max_tokens(model: Model, request: dict[str, Any]) -> None:
    for field in LENGTH_FIELDS:
        value = request.get(field)
        if value is None:
            continue
        # llama.cpp reads n_predict -1 as "no limit": fine where the model sets none.
        unlimited = field == "n_predict" and value == -1
        if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and not unlimited):
            raise ApiError(400, f"`{field}` must be a positive whole number.", param=field)
        if model.max_output is not None and (unlimited or value > model.max_output):
            raise ApiError(
                400,
                f"`{field}` is {value}, but {model.name} writes at most {model.max_output} tokens "
                f"per answer (its max_output); ask for {model.max_output} or fewer.",
                param=field,
                code="max_tokens_exceeded",
            )
