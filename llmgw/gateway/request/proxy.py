"""POST /v1/chat/completions, /v1/completions and /v1/embeddings: check, route, relay.

The request is checked against the model before any replica is bothered. Then replicas are
tried best first (see routing.Model.candidates): a refused connection or a 502/503/504 moves
on to the next, because the client has seen nothing yet. Any other 5xx may be the request's
own doing: it is tried once more elsewhere, and fails the replica only if another replica
answers; failed twice, the client gets the engine's own error. The response status goes to
the client only once the engine's first body byte has arrived: engines send their headers
before the prompt is processed (vLLM does), so a status sent with them would turn a
first-byte timeout into "200, then an error event" and rule out trying another replica.
Once an answer has started, its bytes go to the client as they arrive and nothing is
retried, since a client cannot un-read a token.

Two clocks: the first-byte timeout runs once, from when a replica is asked until its first
body byte (headers included); after that, each wait between chunks has the chunk timeout.

Nothing here holds a thread: one task per request, plus one small task that notices the
client going away and cancels the upstream request, so an abandoned generation stops
costing GPU time.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import falcon
import falcon.asgi
import httpx

from llmgw.gateway.errors import ApiError, error_body
from llmgw.gateway.request.access import Access, check_model
from llmgw.gateway.request.demand import Demand
from llmgw.gateway.request.limits import Limiter
from llmgw.gateway.request.rename import EventRename, JsonRename, renamed
from llmgw.gateway.request.routing import (
    ENDPOINTS_FOR_TASK,
    UPSTREAM_PATHS,
    InFlight,
    Model,
    Replica,
    prefix_key,
)
from llmgw.gateway.request.upstream import Reply, Upstream
from llmgw.gateway.request.usage import Meter, prompt_estimate
from llmgw.gateway.server.config import Settings
from llmgw.gateway.state import metrics
from llmgw.gateway.state.health import Health
from llmgw.gateway.state.outlier import Outliers, RetryBudget

log = logging.getLogger("llmgw.gateway")

Receive = Callable[[], Awaitable[dict[str, Any]]]
CLIENT_GONE = 499  # nginx's "client closed request": logged, never seen by a client
# Set in the request's scope by the server's protocol (gateway/worker.py) when it dropped a
# client that read nothing for this many seconds.
STALLED = "llmgw.stalled"

# Failures that mean "this replica did not take the request": safe to send it elsewhere.
_NOT_TAKEN = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)


# Statuses that say the replica, not the request, is in trouble (a proxy or the engine
# itself cannot serve now): retried elsewhere, and counted against the replica at once.
# Any other 5xx may be the request's own doing; see `Proxy._blame`.
_REPLICA_TROUBLE = frozenset({502, 503, 504})
_ERROR_LIMIT = 1 << 20


class ClientGone:
    """Put in each request's scope by the server's protocol (gateway/worker.py), which
    calls `notify` when the client's connection is lost before the answer is complete.

    Told by the protocol, rather than by a task per request waiting on ASGI's `receive`
    for `http.disconnect`: that task cost more than anything else the proxy does for a
    short answer, and nearly every client stays to the end.
    """

    __slots__ = ("gone", "listeners")

    def __init__(self) -> None:
        self.gone = False
        self.listeners: list[Callable[[], None]] = []

    def notify(self) -> None:
        self.gone = True
        for listener in self.listeners:
            listener()
        self.listeners.clear()


GONE = "llmgw.gone"


class Disconnect:
    """Cancels the request's task if the client leaves while it waits on the upstream."""

    __slots__ = ("task", "waiting", "gone", "watcher", "signal")

    def __init__(self, scope: dict[str, Any]) -> None:
        self.task = asyncio.current_task()
        self.waiting = False
        self.gone = False
        self.watcher: asyncio.Task[None] | None = None
        self.signal: ClientGone | None = scope.get(GONE)
        if self.signal is not None:
            if self.signal.gone:
                self.gone = True
            else:
                self.signal.listeners.append(self._left)
            return
        # Served by some other server than the gateway's worker: watch `receive` instead.
        receive: Receive | None = scope.get("llmgw.receive")
        if receive is not None:
            self.watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left()

    def _left(self) -> None:
        self.gone = True
        # Only while our own code awaits the upstream: cancelling the task anywhere else
        # (inside falcon's send, say) would surface as an error in the server's log.
        if self.waiting and self.task is not None:
            self.task.cancel()

    def absorb(self) -> bool:
        """After a CancelledError: True when it was ours, and the task may carry on."""
        if not self.gone or self.task is None:
            return False
        self.task.uncancel()
        return True

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        if self.signal is not None:
            self.signal.listeners.clear()


class Proxy:
    def __init__(
        self,
        kind: str,
        upstream: Upstream,
        health: Health,
        settings: Settings,
        access: Access,
        outliers: Outliers,
        budget: RetryBudget,
        limiter: Limiter | None = None,
        demand: Demand | None = None,
    ) -> None:
        self.kind = kind
        self.demand = demand
        self.outliers = outliers
        self.budget = budget
        self.limiter = limiter
        self.max_response = settings.max_response_bytes
        self.path = UPSTREAM_PATHS[kind]
        self.upstream = upstream
        self.health = health
        self.access = access
        self.limit = settings.max_body_bytes
        self.first_byte_timeout = settings.first_byte_timeout
        self.chunk_timeout = settings.chunk_timeout
        # No read timeout in the transport: it would apply to every wait alike, and the
        # first byte and the gaps after it have different limits, enforced here (see
        # `_attempt` and `Relay`).
        self.timeouts = {
            "connect": settings.connect_timeout,
            "read": None,
            "write": settings.chunk_timeout,
            "pool": settings.connect_timeout,
        }
        self.retry_after = str(max(1, math.ceil(settings.health_interval)))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        ctx = req.context
        body = await read_body(
            req,
            self.limit,
            f"The request body is over the gateway's limit of {self.limit} bytes; "
            "send less input per request (or raise LLMGW_MAX_BODY_BYTES).",
        )
        if not body:
            raise ApiError(400, "The request has no body; send a JSON object with at least `model`.")
        request = _parse(body)
        requested = request["model"]
        model = ctx.table.lookup(requested)
        ctx.model = model.name
        check_model(ctx.tenant, model, ctx.table)
        if self.kind not in ENDPOINTS_FOR_TASK[model.task]:
            raise _wrong_endpoint(model, self.path)
        _check_max_tokens(model, request)
        tenant = ctx.tenant
        window = self.limiter.admit(tenant) if tenant is not None and self.limiter else None
        ctx.prompt_estimate = prompt_estimate(body)
        meter = Meter()
        if request.get("stream") is True and self.kind != "embedding":
            request, body, meter = _ask_for_usage(request, body)
        watch = Disconnect(req.scope)
        try:
            key = functools.partial(prefix_key, self.kind, request)
            answer = await self._open(model, requested, request, body, ctx, watch, key)
        except BaseException:
            watch.stop()
            raise
        try:
            ctx.replica = answer.replica.endpoint
            upstream = answer.upstream
            length = upstream.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_response:
                await self._refuse_too_large(answer, watch, int(length))
            resp.status = upstream.status_code
            if window is not None:
                resp.set_headers(window.headers())
            # Only the two types an OpenAI client reads: an engine's odd type (text/html, say)
            # would have a browser render its bytes as a page of this gateway's origin.
            rename: EventRename | JsonRename
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                resp.content_type = "text/event-stream"
                # Its first event is in hand (`_open` timed it): that is the first token.
                metrics.labelled(metrics.FIRST_TOKEN, model.name).observe(ctx.ttfb)
                rename = EventRename(requested, meter)
                answer.first = rename.feed(answer.first)
            else:
                resp.content_type = falcon.MEDIA_JSON
                whole = answer.whole(self.max_response)
                if whole is not None:
                    # The usual JSON answer came whole in its first chunk: it goes out in
                    # one piece, and the engine's connection and the replica are free before
                    # it does, with no relay to run.
                    watch.stop()
                    await answer.drop()
                    parsed = meter.read(whole)
                    # An engine started with the served name (as llmgw starts every engine:
                    # llmgw/engines.py) already says what was asked for by that name.
                    if not (isinstance(parsed, dict) and parsed.get("model") == requested):
                        whole = renamed(whole, json.dumps(requested).encode(), complete=True)
                    count_tokens(ctx, meter, upstream.status_code, self.limiter)
                    if watch.gone:  # left as the answer came: logged as the relay logs it
                        raise ApiError(CLIENT_GONE, "client went away")
                    resp.data = whole
                    return
                rename = JsonRename(requested)
                answer.first = rename.feed(answer.first)
                meter.part(answer.first)
                meter.whole = True
                length = upstream.headers.get("content-length")
                if rename.done and length is not None and length.isdigit():
                    resp.content_length = int(length) + rename.growth
            ctx.streaming = True  # the access log's line is the relay's to write, at its end
            resp.stream = Relay(self, req, answer, watch, rename, meter)
        except BaseException:
            # Until the Relay owns the answer, the replica's count and the engine's
            # connection are ours to give back.
            watch.stop()
            await answer.drop()
            raise

    async def _open(
        self,
        model: Model,
        requested: str,
        request: dict[str, Any],
        body: bytes,
        ctx: Any,
        watch: Disconnect,
        key: Callable[[], int | None],
    ) -> Answer:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", ctx.request_id.encode())]
        rewritten: dict[str, bytes] = {}
        tried = 0
        last = ""
        # The first 500 from a live engine, held until another replica has had the request:
        # only then is it known whose fault it was (see `_blame`).
        faulted: Answer | None = None
        self.budget.request()
        try:
            for profile, replica in model.candidates(key):
                if tried and not self.budget.allow():
                    # Past the budget the first failure is the answer: when every replica
                    # is failing, asking each of them too would only double their load.
                    log.warning(
                        "request %s not retried: the retry budget is spent (%s)", ctx.request_id, last
                    )
                    if faulted is not None:
                        ctx.ttfb = time.perf_counter() - ctx.start
                        return faulted
                    raise ApiError(
                        502,
                        f"{model.name} could not answer: {last}. The gateway did not try another "
                        "replica because many requests are failing right now (its retry budget "
                        "is spent); retry shortly.",
                        type="upstream_error",
                        code="upstream_unreachable",
                    )
                tried += 1
                served = profile.served_name
                if served == requested:
                    content = body
                else:
                    content = rewritten.get(served) or json.dumps({**request, "model": served}).encode()
                    rewritten[served] = content
                answer = await self._ask(model, replica, Outgoing(self.kind, headers, content), watch)
                if isinstance(answer, str):  # not taken: why
                    last = answer
                    continue
                status = answer.upstream.status_code
                if status >= 500:
                    metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "status").inc()
                    if faulted is None:
                        faulted = answer
                        last = f"{replica.endpoint} answered {status}"
                        continue
                    # A second engine failed the same request: the request is the cause.
                    # The client gets the first engine's own words, and no replica is marked.
                    answer.release()
                    break
                if faulted is not None:
                    self._blame(model, faulted, replica)
                    faulted = None
                replica.failures = 0
                self.outliers.answered(replica)
                ctx.ttfb = time.perf_counter() - ctx.start
                return answer
        except BaseException:
            if faulted is not None:
                faulted.release()
            raise
        if faulted is not None:
            # Failed everywhere it was tried (perhaps its one replica): the engine's own
            # error says more than a 502 would.
            ctx.ttfb = time.perf_counter() - ctx.start
            return faulted
        if not tried:
            raise ApiError(
                503,
                f"No replica of {model.name} is in rotation right now"
                + ("" if model.has_replicas() else " (the plan places none)")
                + f". Retry in {self.retry_after}s; /dashboard shows replica health.",
                type="service_unavailable",
                code="no_healthy_replica",
                headers={"Retry-After": self.retry_after},
            )
        raise ApiError(
            502,
            f"Every replica of {model.name} failed ({tried} tried; last: {last}). "
            "Retry shortly; if it persists, the engines need attention.",
            type="upstream_error",
            code="upstream_unreachable",
        )

    async def _ask(
        self, model: Model, replica: Replica, outgoing: Outgoing, watch: Disconnect
    ) -> Answer | str:
        """One replica's answer (counted in flight until it is released), or why the
        replica did not take the request; ApiError when no other replica may be tried."""
        try:
            answer = await self._attempt(outgoing, replica, watch, model.name)
        except _NOT_TAKEN as exc:
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "connect").inc()
            self.health.failed(replica, f"request failed: {type(exc).__name__}")
            self.outliers.failed(model, replica, f"request failed: {type(exc).__name__}")
            return f"{replica.endpoint} could not be reached ({type(exc).__name__})"
        except (TimeoutError, httpx.TimeoutException):
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "timeout").inc()
            self.outliers.failed(model, replica, f"no first byte within {self.first_byte_timeout:g}s")
            raise ApiError(
                504,
                f"{model.name} did not start answering within {self.first_byte_timeout:g}s "
                f"(replica {replica.endpoint}). Retry, or raise LLMGW_FIRST_BYTE_TIMEOUT "
                "if long prompts are normal here.",
                type="timeout_error",
                code="upstream_timeout",
            ) from None
        except httpx.HTTPError as exc:
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "connect").inc()
            return f"{replica.endpoint} failed ({type(exc).__name__})"
        except asyncio.CancelledError:
            if watch.absorb():
                raise ApiError(CLIENT_GONE, "client went away") from None
            raise
        status = answer.upstream.status_code
        if status in _REPLICA_TROUBLE:
            await answer.drop()
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "status").inc()
            self.health.failed(replica, f"answered {status}")
            self.outliers.failed(model, replica, f"answered {status}")
            return f"{replica.endpoint} answered {status}"
        return answer

    async def _refuse_too_large(self, answer: Answer, watch: Disconnect, length: int) -> None:
        # Said before a byte of it is sent: the client gets a clean error, not a cut body.
        watch.stop()
        await answer.drop()
        metrics.UPSTREAM_ERRORS.labels(answer.replica.endpoint, "too_large").inc()
        raise ApiError(
            502,
            f"Replica {answer.replica.endpoint} announced an answer of {length} bytes, over the "
            f"gateway's limit of {self.max_response} (LLMGW_MAX_RESPONSE_BYTES); the engine is "
            "misbehaving, or the limit needs raising.",
            type="upstream_error",
            code="upstream_answer_too_large",
        )

    def _blame(self, model: Model, faulted: Answer, other: Replica) -> None:
        """`other` answered the request `faulted`'s replica failed: the replica is at fault.

        Only then: any 5xx once counted against a replica, and six requests whose content
        made the engine fail took a healthy replica out of rotation for everyone.
        """
        faulted.release()
        status = faulted.upstream.status_code
        why = f"answered {status} to a request {other.endpoint} answered"
        self.health.failed(faulted.replica, why)
        self.outliers.failed(model, faulted.replica, why)

    async def _attempt(
        self, outgoing: Outgoing, replica: Replica, watch: Disconnect, model: str = ""
    ) -> Answer:
        """Ask one replica; return once its first body byte (or its whole, empty answer) is
        here, within one first-byte allowance for the headers and that byte together.

        The request is counted in flight to the replica from here on: the answer holds the
        count, and if there is no answer, the count is given back before the error leaves.
        """
        upstream: Reply | httpx.Response | None = None
        watch.waiting = True
        hold = replica.hold()
        try:
            if replica.agent is not None and self.demand is not None:
                # Held here until its agent has the engine ready (a client that leaves
                # meanwhile cancels the wait); the first-byte allowance starts after.
                lease = await self.demand.lease(model, replica)
                hold.after = functools.partial(self.demand.release, replica, lease)
            async with asyncio.timeout(self.first_byte_timeout):
                upstream = await self.upstream.post(
                    replica.urls[outgoing.kind], outgoing.headers, outgoing.body, self.timeouts
                )
                chunks = upstream.aiter_raw()
                if upstream.status_code in _REPLICA_TROUBLE:
                    return Answer(upstream, hold, chunks, b"")  # not read: it is retried
                if upstream.status_code >= 500:
                    # Read whole, in case it is passed on: whether it is, only the next
                    # replica's answer can tell.
                    error = await _read_error(chunks)
                    await upstream.aclose()
                    return Answer(upstream, hold, _nothing(), error)
                first = await anext(chunks, b"")
        except BaseException:
            watch.waiting = False
            hold.release()
            if upstream is not None:
                # Unfinished: closing drops the connection, so the engine stops working on it.
                await upstream.aclose()
            raise
        finally:
            watch.waiting = False
        return Answer(upstream, hold, chunks, first)


class Outgoing:
    """What goes to whichever replica is asked: the endpoint's kind, headers and body."""

    __slots__ = ("kind", "headers", "body")

    def __init__(self, kind: str, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.kind = kind
        self.headers = headers
        self.body = body


async def _read_error(chunks: AsyncIterator[bytes]) -> bytes:
    parts, total = [], 0
    async for part in chunks:
        total += len(part)
        if total > _ERROR_LIMIT:
            # No engine explains itself at this length: taken as a replica in trouble.
            raise httpx.RemoteProtocolError(f"a 5xx answer over {_ERROR_LIMIT} bytes")
        parts.append(part)
    return b"".join(parts)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing


class AnswerCut(Exception):
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
        proxy: Proxy,
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
            self.status = CLIENT_GONE
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
            self.status = CLIENT_GONE
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
            count_tokens(self.req.context, self.meter, self.upstream.status_code, self.proxy.limiter)
            self.proxy.access.finish(self.req, self.status)


def count_tokens(ctx: Any, meter: Meter, status: int, limiter: Limiter | None) -> None:
    """Count an ended answer's tokens in the metrics, and charge its key for them."""
    try:
        meter.finish()
        if meter.prompt is not None:
            prompt, completion = meter.prompt, meter.completion or 0
        elif status < 400:
            # Cut short (the client left, or the engine broke off) before usage came: the
            # prompt was read all the same, so the key is charged its estimate.
            prompt, completion = ctx.prompt_estimate, 0
        else:
            return  # the engine refused the request: nothing was generated
        tenant = ctx.tenant
        key = tenant.name if tenant is not None else "-"
        metrics.labelled(metrics.TOKENS, ctx.model, key, "prompt").inc(prompt)
        if completion:
            metrics.labelled(metrics.TOKENS, ctx.model, key, "completion").inc(completion)
        if tenant is not None and limiter is not None:
            limiter.charge(tenant, prompt + completion)
    except Exception:  # a miscount must not lose the access log line and metrics
        log.exception("counting the tokens of request %s failed", ctx.request_id)


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


def _ask_for_usage(request: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes, Meter]:
    """A stream's request asking the engine for usage; and the meter that takes the usage
    event out again when the client did not ask for it."""
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return request, body, Meter()
    given = options if isinstance(options, dict) else {}
    asked = {**request, "stream_options": {**given, "include_usage": True}}
    return asked, json.dumps(asked).encode(), Meter(strip_usage_event=True)


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


def _parse(body: bytes) -> dict[str, Any]:
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
    if not isinstance(model, str) or not model:
        raise ApiError(400, "The request has no `model`; name one from GET /v1/models.", param="model")
    return request


def _wrong_endpoint(model: Model, path: str) -> ApiError:
    right = " or ".join(UPSTREAM_PATHS[k] for k in sorted(ENDPOINTS_FOR_TASK[model.task]))
    return ApiError(
        400,
        f"'{model.name}' is {_article(model.task)} {model.task} model; send it to POST {right}, not {path}.",
        param="model",
        code="wrong_endpoint",
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


# Every field an engine takes as the answer's length limit: vLLM reads the first two,
# llama.cpp all three. Checking only the OpenAI ones let `n_predict` past max_output.
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")


def _check_max_tokens(model: Model, request: dict[str, Any]) -> None:
    for field in _TOKEN_LIMITS:
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
