"""Every error the gateway answers, in OpenAI's shape, so clients' error handling just works;
on /v1/messages (the Anthropic Messages API) in Anthropic's shape, for the same reason.

ApiError                 raised by resources; status, message, type, param, code
falcon.HTTPError         falcon's own (unknown path, wrong method): reshaped by
                         `serialize_http_error`
anything else            `handle_unexpected`: logged with its traceback, answered
                         as a 500 that names the request id, never with the traceback

Raised inside the gateway and caught elsewhere in it, never answered as they are:

AnswerCut                request/relay: a JSON answer ended early; the app's ASGI wrapper
                         drops the connection so the client sees an incomplete body
LookupFailed             state/discovery: a DNS name could not be resolved; the last good
                         list of pods keeps serving
asyncio.CancelledError   request/gone: the client left; absorbed where the proxy awaits
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi

from llmgw.gateway.api import APIS

log = logging.getLogger("llmgw.gateway")


# What of a client's own value an error repeats: a 404 once echoed a 7.5 MB model name.
ECHO_CHARS = 64


def echo(value: str) -> str:
    """A client's value as an error repeats it: quoted, and cut short past ECHO_CHARS."""
    if len(value) <= ECHO_CHARS:
        return repr(value)
    return repr(value[:ECHO_CHARS]) + f" (cut short; {len(value):,} characters)"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


# Anthropic's error types by status (its API's "Errors" page). 503 is its overloaded_error
# too: a client retries that, as it should retry a gateway with no replica in rotation.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


# The paths whose clients read errors in Anthropic's shape, and the paths beneath them (an
# unknown /v1/messages/... is still asked by an Anthropic client).
_ANTHROPIC_PATHS = tuple(api.path for api in APIS.values() if api.errors == "anthropic")


def speaks_anthropic(path: str) -> bool:
    """Whether a path is the Messages API's, whose clients read errors in Anthropic's shape."""
    return any(path == p or path.startswith(p + "/") for p in _ANTHROPIC_PATHS)


_PATHS = [api.path for api in APIS.values()]
_THE_API = "the API is GET /v1/models and POST " + ", ".join(_PATHS[:-1]) + " and " + _PATHS[-1]


def responses_error_event(message: str) -> bytes:
    """How the Responses API ends a stream that fails: an `error` event, which its clients
    (the openai SDK's `responses.stream`) read as the stream's failure; a bare `data:` error, as
    chat streams end, reached them as an event of no type they know."""
    data = {"type": "error", "code": "upstream_error", "message": message, "param": None}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


def anthropic_error_body(status: int, message: str) -> bytes:
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def respond(resp: falcon.asgi.Response, error: ApiError, anthropic: bool = False) -> None:
    resp.status = error.status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = anthropic_error_body(error.status, error.message) if anthropic else error.body()
    for name, value in error.headers.items():
        resp.set_header(name, value)


async def handle_api_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: ApiError, params: Any
) -> None:
    respond(resp, ex, speaks_anthropic(req.path))


async def handle_unexpected(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: Any
) -> None:
    if isinstance(ex, falcon.HTTPError):  # falcon's own errors keep their status
        serialize_http_error(req, resp, ex)
        resp.status = ex.status
        resp.set_headers(ex.headers or {})
        return
    request_id = getattr(req.context, "request_id", "?")
    log.exception("unexpected error serving %s %s (request %s)", req.method, req.path, request_id)
    respond(
        resp,
        ApiError(
            500,
            f"The gateway failed on this request (request id {request_id}); "
            "its log has the details. Retrying may work; if it keeps failing, report the id.",
            type="server_error",
        ),
        speaks_anthropic(req.path),
    )


_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def serialize_http_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, exception: falcon.HTTPError
) -> None:
    status = exception.status_code
    if status == 404 and getattr(req.context, "api", False):
        message = f"There is no {req.path} here; {_THE_API}."
    elif status == 404:
        message = f"There is no {req.path} here; the API is under /v1 (see GET /v1/models)."
    elif status == 405:
        message = f"{req.path} does not answer {req.method}."
    else:
        message = exception.description or exception.title or "request refused"
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    resp.content_type = falcon.MEDIA_JSON
    anthropic = speaks_anthropic(req.path)
    resp.data = anthropic_error_body(status, message) if anthropic else error_body(message, kind)
