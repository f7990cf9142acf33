"""An engine's answer on its way to the client: the first bytes in hand (`Answer`), then
chunk by chunk (`Relay`), timed, counted, renamed and cut off with a sentence when the engine
breaks; and the tokens it used charged when it ends, however it ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import falcon.asgi
import httpx

from llmgw.errors import ServiceError
from llmgw.gateway.api import Api
from llmgw.gateway.errors import anthropic_error_body, error_body, responses_error_event
from llmgw.gateway.request.access import Access
from llmgw.gateway.request.context import RequestContext, context_of
from llmgw.gateway.request.disconnect import CLIENT_GONE, STALLED, Disconnect
from llmgw.gateway.request.limits import Limits
from llmgw.gateway.request.rename import EventRename, JsonRename
from llmgw.gateway.request.usage import Meter
from llmgw.gateway.state import metrics, tracing
from llmgw.gateway.state.routes import InFlight
from llmgw.gateway.upstream import Reply

log = logging.getLogger("llmgw.gateway")

_ERROR_LIMIT = 1 << 20


class Relaying(Protocol):
    """What a relay needs of the endpoint that asked: its limits, and where the ending goes."""

    api: Api
    chunk_timeout: float
    max_response: int
    limiter: Limits | None
    access: Access


class Outgoing:
    """What goes to whichever replica is asked: the endpoint's kind, headers and body."""

    __slots__ = ("kind", "headers", "body")

    def __init__(self, kind: str, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.kind = kind
        self.headers = headers
        self.body = body


async def read_error(chunks: AsyncIterator[bytes]) -> bytes:
    parts, total = [], 0
    async for part in chunks:
        total += len(part)
        if total > _ERROR_LIMIT:
            # No engine explains itself at this length: taken as a replica in trouble.
            raise httpx.RemoteProtocolError(f"a 5xx answer over {_ERROR_LIMIT} bytes")
        parts.append(part)
    return b"".join(parts)


async def no_chunks() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing


class AnswerCut(ServiceError):
    """A JSON answer ended early: the server must drop the connection, not end the body."""


class Answer:
    """A replica's answer whose first body bytes are in hand: what may go to the client."""

    __slots__ = ("upstream", "hold", "replica", "chunks", "first")

    def __init__(
        self, upstream: Reply | httpx.Response, hold: InFlight, chunks: AsyncIterator[bytes], first: bytes
    ) -> None:
        self.upstream = upstream
        self.hold = hold
        self.replica = hold.replica
        self.chunks = chunks
        self.first = first

    def release(self) -> None:
        """Its replica is done with: once, however many paths end the answer."""
        self.hold.release()

    async def drop(self) -> None:
        """Done with before the client has all of it: the replica is released, and the
        engine's connection given back, or closed if the answer is unfinished (which is what
        tells the engine to stop generating)."""
        self.release()
        await self.upstream.aclose()

    def whole(self, limit: int) -> bytes | None:
        """The whole body, when it all came in the first chunk and is at most `limit` bytes.

        Only then: a longer answer goes through the Relay, which notices a client that
        stops reading or leaves while it is sent, and logs it so.
        """
        upstream = self.upstream
        if isinstance(upstream, Reply) and len(self.first) <= limit and upstream.body.finished():
            return self.first
        return None


class Relay:
    """The upstream's answer, chunk by chunk, as falcon's response stream.

    A class rather than a generator so falcon's `close()` call in its `finally` releases the
    upstream connection and the replica at once, whatever happened to the client.
    """

    def __init__(
        self,
        proxy: Relaying,
        req: falcon.asgi.Request,
        answer: Answer,
        watch: Disconnect,
        rename: JsonRename | EventRename,
        meter: Meter,
    ) -> None:
        self.proxy = proxy
        self.rename = rename
        self.meter = meter
        self.req = req
        self.upstream = answer.upstream
        self.answer = answer
        self.replica = answer.replica
        self.watch = watch
        self.chunks = answer.chunks
        self.first: bytes | None = answer.first or None
        self.status = answer.upstream.status_code
        self.closed = False
        self.event_stream = isinstance(rename, EventRename)
        self.relayed = 0
        # The stream's last event ([DONE]) has gone to the client: it has the whole answer,
        # so leaving before the engine closes its end is no failure. Logged as 499, every
        # client that closed on [DONE] looked like one that gave up.
        self.delivered = False
        # The gap between chunks is timed by the wire itself where it can be: it sets a timer
        # only when it has to wait for a chunk, where an asyncio.timeout built a context and
        # scheduled a timer around every chunk of every stream. httpx's transport (https)
        # has no such clock.
        self.timed_by_wire = isinstance(self.upstream, Reply)
        if isinstance(self.upstream, Reply):
            self.upstream.body.read_timeout = proxy.chunk_timeout

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        if self.first is not None:
            first, self.first = self.first, None
            return await self._counted(first)
        while True:  # a chunk the rename holds on to is not worth a send of nothing
            chunk = await self._next()
            if chunk:
                if self.meter.whole:
                    self.meter.part(chunk)
                return await self._counted(chunk)

    async def _counted(self, chunk: bytes) -> bytes:
        # An answer with no declared length (chunked, or one that never ends) is counted as
        # it goes: relaying it without limit would keep a worker and a client busy forever.
        self.relayed += len(chunk)
        if self.event_stream and chunk.rstrip().endswith(b"data: [DONE]"):
            self.delivered = True
        if self.relayed <= self.proxy.max_response or self.closed:
            return chunk
        limit = self.proxy.max_response
        return await self._cut(
            "too_large",
            f"The answer was cut off: replica {self.replica.endpoint} sent more than the gateway's "
            f"limit of {limit} bytes (LLMGW_MAX_RESPONSE_BYTES).",
        )

    async def _next(self) -> bytes:
        if self.watch.gone:
            # The client left while its last chunk was being sent (the server drops the
            # writes of a closed connection without a word): nothing more is wanted.
            self.status = self.status if self.delivered else CLIENT_GONE
            await self.close()
            raise StopAsyncIteration
        self.watch.waiting = True
        try:
            if self.timed_by_wire:
                chunk = self.rename.feed(await self.chunks.__anext__())
            else:
                async with asyncio.timeout(self.proxy.chunk_timeout):
                    chunk = self.rename.feed(await self.chunks.__anext__())
        except StopAsyncIteration:
            rest = self.rename.flush()
            if self.event_stream and rest and not rest.endswith(b"\n"):
                # The stream ended inside an event: a client would read half an event as
                # a whole one, or wait for the rest. Dropped, and said so instead.
                return await self._cut(
                    "broken",
                    f"The answer was cut off: replica {self.replica.endpoint} ended its event "
                    "stream in the middle of an event.",
                )
            await self.close()
            if rest:
                return rest
            raise
        except asyncio.CancelledError:
            if not self.watch.absorb():
                raise
            self.status = self.status if self.delivered else CLIENT_GONE
            await self.close()
            raise StopAsyncIteration from None
        except (httpx.HTTPError, TimeoutError) as exc:
            return await self._broken(exc)
        finally:
            self.watch.waiting = False
        return chunk

    async def _broken(self, exc: BaseException) -> bytes:
        kind = "timeout" if isinstance(exc, (TimeoutError, httpx.TimeoutException)) else "broken"
        message = f"The answer was cut off: replica {self.replica.endpoint} " + (
            "stopped sending." if kind == "timeout" else "broke the connection."
        )
        return await self._cut(kind, message, why=type(exc).__name__)

    async def _cut(self, kind: str, message: str, why: str | None = None) -> bytes:
        """End an answer the client has part of; all we can do is say so where it will be
        read: a final error event in a stream, after the last whole event. A JSON answer
        has nowhere to say it, so the connection is dropped before the body's end, which
        every HTTP client reports as an incomplete answer rather than reading half a body
        as a whole one."""
        endpoint = self.replica.endpoint
        metrics.UPSTREAM_ERRORS.labels(endpoint, kind).inc()
        log.warning(
            "answer from %s cut off (%s) for request %s",
            endpoint,
            why or kind,
            self.req.context.request_id,
        )
        self.status = 504 if kind == "timeout" else 502
        await self.close()
        if not self.event_stream:
            raise AnswerCut(message)
        if self.proxy.api.events == "anthropic":  # as Anthropic ends a stream that fails
            return b"event: error\ndata: " + anthropic_error_body(self.status, message) + b"\n\n"
        if self.proxy.api.events == "responses":
            return responses_error_event(message)
        return b"data: " + error_body(message, "upstream_error") + b"\n\n"

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        stalled = self.req.scope.get(STALLED)
        if stalled is not None:
            self.status = CLIENT_GONE
            log.warning(
                "client of request %s read nothing for %gs; its answer from %s was cut off",
                self.req.context.request_id,
                stalled,
                self.replica.endpoint,
            )
        self.watch.stop()
        try:
            await self.answer.drop()
        finally:
            count_tokens(context_of(self.req), self.meter, self.upstream.status_code, self.proxy.limiter)
            self.proxy.access.finish(self.req, self.status)


def context_exceeded(answer: Any, kind: str) -> bytes | None:
    """An engine's "prompt over the context" error (an engine's 400, parsed) in OpenAI's
    shape, which clients branch on (`code: context_length_exceeded`) to trim and retry;
    None for any other answer. llama-server says `exceed_context_size_error` with its own
    fields; vLLM writes OpenAI's sentence in its own envelope."""
    if not isinstance(answer, dict):
        return None
    nested = answer.get("error")
    error: dict[str, Any] = nested if isinstance(nested, dict) else answer
    message = error.get("message")
    if not isinstance(message, str):
        return None
    if error.get("type") == "exceed_context_size_error":
        limit, given = error.get("n_ctx"), error.get("n_prompt_tokens")
        most = f"is {limit} tokens" if isinstance(limit, int) else "was exceeded"
        over = f" However, your request has {given} tokens." if isinstance(given, int) else ""
        message = (
            f"This model's maximum context length {most}.{over} "
            "Please reduce the length of the messages or the completion."
        )
    elif "maximum context length" not in message:
        return None
    param = "messages" if kind == "chat" else "input" if kind == "embedding" else "prompt"
    return error_body(message, "invalid_request_error", param, "context_length_exceeded")


def count_tokens(ctx: RequestContext, meter: Meter, status: int, limiter: Limits | None) -> None:
    """Count an ended answer's tokens in the metrics, and charge its key for them."""
    if meter.free:  # a counting request: toward rpm only, never tpm
        unreserve(ctx, limiter)
        return
    try:
        meter.finish()
        if meter.prompt is not None and meter.final:
            prompt, completion = meter.prompt, meter.completion or 0
            tracing.usage(prompt, meter.completion)
        elif status < 400 or meter.prompt is not None:
            # Cut short (the client left, or the engine broke off) before the usage of the
            # whole answer came: the prompt was read all the same, and each event relayed
            # carried about a token, so the key is charged at least that; hanging up just
            # before the usage event once cost nothing but the prompt.
            prompt = meter.prompt if meter.prompt is not None else ctx.prompt_estimate
            completion = meter.relayed()
        else:
            unreserve(ctx, limiter)
            return  # the engine refused the request: nothing was generated
        tenant = ctx.tenant
        key = tenant.name if tenant is not None else "-"
        model = ctx.model or "unknown"
        metrics.labelled(metrics.TOKENS, model, key, "prompt").inc(prompt)
        if completion:
            metrics.labelled(metrics.TOKENS, model, key, "completion").inc(completion)
        if tenant is not None and limiter is not None:
            reservation, ctx.reservation = ctx.reservation, None
            spend, ctx.spend = ctx.spend, None
            limiter.count(tenant, prompt, completion, reservation, spend)
        if ctx.ticket is not None:
            ctx.ticket.used(prompt + completion)
    except Exception:  # a miscount must not lose the access log line and metrics
        log.exception("counting the tokens of request %s failed", ctx.request_id)


def unreserve(ctx: RequestContext, limiter: Limits | None) -> None:
    """Give back the tokens held for a request that generated nothing."""
    reservation, spend = ctx.reservation, ctx.spend
    if (reservation is None and spend is None) or limiter is None or ctx.tenant is None:
        return
    ctx.reservation = ctx.spend = None
    limiter.charge(ctx.tenant, 0, reservation, spend)


