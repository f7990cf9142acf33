"""POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages,
/v1/messages/count_tokens, /v1/rerank and /v1/tokenize: the retry loop, one Proxy per kind.

Every kind is routed by its body's `model` and goes through the same checks, limits,
renames and metering; what differs by API (usage's shape, the length field, the prefix
key's fields, the error shape) is each stage's to know, not a copy of this loop.

The body is read and checked in request/body.py, the answer relayed in request/relay.py,
a client that leaves noticed in request/disconnect.py; this module decides where a request goes.

The request is checked against the model before any replica is bothered. Then replicas are
tried best first (see state/routes.py: Model.candidates): a refused connection or a 502/503/504 moves
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import httpx

from llmgw.gateway.api import APIS
from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.access import Access, check_model
from llmgw.gateway.request.body import (
    ask_for_usage,
    capped_for,
    check_max_tokens,
    output_limit,
    parse_request,
    read_body,
    wrong_endpoint,
)
from llmgw.gateway.request.context import RequestContext, context_of
from llmgw.gateway.request.disconnect import CLIENT_GONE, Disconnect
from llmgw.gateway.request.lease import AgentSilent, EngineFailed, Leases
from llmgw.gateway.request.limits import Limits, Window
from llmgw.gateway.request.prefix import prefix_key
from llmgw.gateway.request.refusals import AgentDidNotAnswer, NotReady, budget_spent, none_answered
from llmgw.gateway.request.relay import (
    Answer,
    Outgoing,
    Relay,
    context_exceeded,
    count_tokens,
    no_chunks,
    read_error,
    unreserve,
)
from llmgw.gateway.request.rename import EventRename, JsonRename, renamed
from llmgw.gateway.request.slot_ticket import take_slot, ticket_for
from llmgw.gateway.request.usage import Meter, prompt_estimate
from llmgw.gateway.schedule import Scheduler, Ticket, band_of
from llmgw.gateway.settings import VIA_HEADER, Settings
from llmgw.gateway.state import metrics, tracing
from llmgw.gateway.state.health import Health
from llmgw.gateway.state.outlier import Outliers, RetryBudget
from llmgw.gateway.state.routes import (
    Model,
    Replica,
)
from llmgw.gateway.upstream import Reply, Upstream

log = logging.getLogger("llmgw.gateway")

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


# The model could not take the request (no replica, its start failed, its wait ran out) or
# its replicas failed before the first byte: its fallbacks are asked (see `_open_or_fall_back`).
_FALL_BACK_ON = frozenset({502, 503, 504})
FALLBACK_HEADER = "x-llmgw-fallback"
# A caller may put its own request below its key's priority (never above): a batch job's key
# can send its urgent request at the key's band and the rest lower.
PRIORITY_HEADER = "x-llmgw-priority"
# How long the answer waited for a replica's slot, on the answers that waited at all.
QUEUE_WAIT_HEADER = "x-llmgw-queue-wait-ms"


@dataclass(frozen=True)
class Attempt:
    """One model's try at a request: the model, the name its answer carries, the request as
    that model is sent it (and its bytes); and what every try of one request shares: its
    context, the watch on its client, and its prompt's routing key."""

    model: Model
    requested: str
    request: dict[str, Any]
    body: bytes
    ctx: RequestContext
    watch: Disconnect
    key: Callable[[], int | None]

    def fallback(self, other: Model, kind: str) -> Attempt:
        """The same request for a fallback, as its own model would take it: named for it,
        and its answer's length capped at its max_output."""
        asked = capped_for(other, kind, {**self.request, "model": other.name})
        return Attempt(other, other.name, asked, json.dumps(asked).encode(), self.ctx, self.watch, self.key)


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
        limiter: Limits | None = None,
        leases: Leases | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.kind = kind
        self.scheduler = scheduler
        self.api = APIS[kind]
        self.leases = leases
        self.outliers = outliers
        self.budget = budget
        self.limiter = limiter
        self.max_response = settings.max_response_bytes
        self.path = self.api.path
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
        self.instance = settings.instance

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        ctx = context_of(req)
        body, request, model = await self._checked(req, ctx)
        requested = request["model"]
        tenant = ctx.tenant
        ctx.prompt_estimate = prompt_estimate(body)
        # Every field and header is checked before admission: a request refused after it
        # kept its tokens held (five bad priority headers left a budget 5,100 tokens spent).
        ctx.band = band_of(tenant.priority if tenant is not None else None, req.get_header(PRIORITY_HEADER))
        asked = request
        request, most = output_limit(model, self.kind, request)
        counting = self.api.counts_only
        if most is None and self.api.generates:
            # Nothing bounds the answer (no max_output, no max_tokens, or n_predict -1): it may
            # run to the end of the context, so that is what it holds. Holding only its prompt
            # let 16 such requests at once spend 16,048 tokens of a 3,000-token budget.
            most = max(1, model.context_length - ctx.prompt_estimate)
        reserve = 0 if counting else ctx.prompt_estimate + (most or 0)
        window = (
            # A counting request counts toward rpm and reserves no tokens (see Api.counts_only).
            self.limiter.admit(tenant, reserve, ctx.prompt_estimate)
            if tenant is not None and self.limiter
            else None
        )
        ctx.reservation = window.reservation if window is not None else None
        ctx.spend = window.spend if window is not None else None
        if ctx.spend is not None:  # on every answer, the engine's errors too
            resp.set_headers(ctx.spend.headers())
        meter = Meter(free=counting)
        # Only some APIs must be asked for a stream's usage (chat and completions); the
        # Responses and Messages APIs always send it.
        if request.get("stream") is True and self.api.asks_for_usage:
            request, meter = ask_for_usage(request)
        if request is not asked:  # written once, whatever the two steps above added
            body = json.dumps(request).encode()
        watch = Disconnect(req.scope)
        try:
            key = functools.partial(prefix_key, self.kind, request)
            attempt = Attempt(model, requested, request, body, ctx, watch, key)
            answer, served = await self._open_or_fall_back(attempt)
        except BaseException:
            watch.stop()
            unreserve(ctx, self.limiter)
            raise
        try:
            if served is not model:
                # The answer names the model that wrote it, and says it was not the one asked.
                resp.set_header(FALLBACK_HEADER, served.name)
                requested = ctx.model = served.name
            await self._respond(req, resp, answer, watch, meter, window, (served, requested))
        except BaseException:
            # Until the Relay owns the answer, the replica's count and the engine's
            # connection are ours to give back.
            watch.stop()
            await answer.drop()
            unreserve(ctx, self.limiter)
            raise

    async def _checked(
        self, req: falcon.asgi.Request, ctx: RequestContext
    ) -> tuple[bytes, dict[str, Any], Model]:
        """The request's body, as read and parsed, and its model: everything checked that can
        be before any replica is bothered; ApiError for the first thing wrong."""
        if req.get_header(VIA_HEADER) == self.instance:
            raise ApiError(
                508,
                "The gateway received a request it sent itself: an endpoint in the plan points "
                "at the gateway, not at an engine. Point that replica at the engine's own "
                "address and port.",
                type="upstream_error",
                code="loop_detected",
            )
        body = await read_body(
            req,
            self.limit,
            f"The request body is over the gateway's limit of {self.limit} bytes; "
            "send less input per request (or raise LLMGW_MAX_BODY_BYTES).",
        )
        if not body:
            raise ApiError(400, "The request has no body; send a JSON object with at least `model`.")
        request = parse_request(body)
        requested = request["model"]
        tenant = ctx.tenant
        tracing.begin(self.kind, requested, request, req.headers, tenant.name if tenant is not None else None)
        model = ctx.table.lookup(requested, tenant.may_use if tenant is not None else None)
        ctx.model = model.name
        check_model(tenant, model, ctx.table)
        if model.task not in self.api.tasks:
            raise wrong_endpoint(model, self.path)
        check_max_tokens(model, request)
        return body, request, model

    async def _respond(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        answer: Answer,
        watch: Disconnect,
        meter: Meter,
        window: Window | None,
        named: tuple[Model, str],
    ) -> None:
        """Send the answer on: whole when it came in one piece, else through a Relay."""
        ctx = context_of(req)
        model, requested = named
        ctx.replica = answer.replica.endpoint
        tracing.served_by(ctx.replica, model.name)
        upstream = answer.upstream
        length = upstream.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_response:
            await self._refuse_too_large(answer, watch, int(length))
        resp.status = upstream.status_code
        if window is not None:
            resp.set_headers(window.headers())
        if ctx.ticket is not None and ctx.ticket.waited:
            resp.set_header(QUEUE_WAIT_HEADER, str(round(ctx.ticket.waited * 1000)))
        # Only the two types an OpenAI client reads: an engine's odd type (text/html, say)
        # would have a browser render its bytes as a page of this gateway's origin.
        rename: EventRename | JsonRename
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            resp.content_type = "text/event-stream"
            # Its first event is in hand (`_open` timed it): that is the first token.
            metrics.labelled(metrics.FIRST_TOKEN, model.name).observe(ctx.ttfb or 0.0)
            rename = EventRename(requested, meter, responses=self.kind == "responses")
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
                tracing.answer(parsed)
                # An engine started with the served name (as llmgw starts every engine:
                # llmgw/engines/) already says what was asked for by that name.
                if not (isinstance(parsed, dict) and parsed.get("model") == requested):
                    whole = renamed(whole, json.dumps(requested).encode(), complete=True)
                if upstream.status_code == 400:
                    whole = context_exceeded(parsed, self.kind) or whole
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

    async def _open_or_fall_back(self, attempt: Attempt) -> tuple[Answer, Model]:
        """The model's answer and the model that gave it: the model itself, or when it could
        not take the request or its replica failed before the first byte, the first of its
        fallbacks that answers and that the key may use. A 4xx is the caller's own error and
        is never tried elsewhere; when every fallback fails too, the model's own failure is
        the answer, since it is the model the client asked for."""
        model, ctx = attempt.model, attempt.ctx
        failure: ApiError | Answer
        try:
            answer = await self._open(attempt)
        except ApiError as exc:
            if exc.status not in _FALL_BACK_ON or not model.listing.get("fallbacks"):
                raise
            failure = exc
        else:
            if answer.upstream.status_code < 500 or not model.listing.get("fallbacks"):
                return answer, model
            failure = answer
        try:
            for other in self._fallbacks(model, ctx):
                try:
                    answer = await self._open(attempt.fallback(other, self.kind))
                except ApiError as exc:
                    if exc.status not in _FALL_BACK_ON:
                        raise
                    log.info("request %s: fallback %s failed too (%s)", ctx.request_id, other.name, exc.code)
                    continue
                if answer.upstream.status_code >= 500:
                    answer.release()
                    continue
                if isinstance(failure, Answer):
                    failure.release()
                metrics.FALLBACKS.labels(model.name, other.name).inc()
                log.info("request %s: %s could not answer; %s did", ctx.request_id, model.name, other.name)
                return answer, other
        except BaseException:
            if isinstance(failure, Answer):
                failure.release()
            raise
        if isinstance(failure, ApiError):
            raise failure
        return failure, model

    def _fallbacks(self, model: Model, ctx: RequestContext) -> list[Model]:
        """The model's fallbacks this request may go to: served now, of an endpoint this kind
        answers, and allowed to the key (a key must not reach a model through another's)."""
        usable = []
        for name in model.listing.get("fallbacks", ()):
            try:
                other = ctx.table.lookup(name)  # by name or alias, as the catalogue may say
            except ApiError:  # not served by this plan
                continue
            if other.task not in self.api.tasks:
                continue
            if ctx.tenant is not None and not ctx.tenant.may_use(other.names()):
                continue
            usable.append(other)
        return usable

    async def _open(self, attempt: Attempt) -> Answer:
        model, requested, request, body = attempt.model, attempt.requested, attempt.request, attempt.body
        ctx, watch, key = attempt.ctx, attempt.watch, attempt.key
        headers = [
            (b"content-type", b"application/json"),
            (b"x-request-id", ctx.request_id.encode()),
            (VIA_HEADER.encode(), self.instance.encode()),
            *tracing.propagation(),  # the engine's spans join this request's trace
        ]
        rewritten: dict[str, bytes] = {}
        tried = not_ready = 0
        last = ""
        # The first 500 from a live engine, held until another replica has had the request:
        # only then is it known whose fault it was (see `_blame`).
        faulted: Answer | None = None
        self.budget.request()
        ticket = ctx.ticket = ticket_for(self.scheduler, model, ctx)
        try:
            candidates = list(model.candidates(key))
            while candidates:
                if tried and not self.budget.allow():
                    # Past the budget the first failure is the answer: when every replica
                    # is failing, asking each of them too would only double their load.
                    log.warning(
                        "request %s not retried: the retry budget is spent (%s)", ctx.request_id, last
                    )
                    if faulted is not None:
                        ctx.ttfb = time.perf_counter() - ctx.start
                        return faulted
                    raise budget_spent(model, last)
                tried += 1
                if ticket is None:
                    profile, replica = candidates.pop(0)
                else:
                    profile, replica = await take_slot(ticket, candidates, watch, ctx.table.plan)
                if tried > 1:
                    tracing.retried(replica.endpoint, last)
                content = _named(profile.served_name, requested, body, request, rewritten)
                answer = await self._ask(model, replica, Outgoing(self.kind, headers, content), watch, ticket)
                if isinstance(answer, str):  # not taken: why
                    last = answer
                    not_ready += isinstance(answer, NotReady)
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
        raise none_answered(model, tried, not_ready, last, self.retry_after)

    async def _ask(
        self, model: Model, replica: Replica, outgoing: Outgoing, watch: Disconnect, ticket: Ticket | None
    ) -> Answer | str:
        """One replica's answer (counted in flight until it is released), or why the
        replica did not take the request; ApiError when no other replica may be tried."""
        try:
            answer = await self._attempt(outgoing, replica, watch, model.name, ticket)
        except _NOT_TAKEN as exc:
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "connect").inc()
            self.health.failed(replica, f"request failed: {type(exc).__name__}")
            self.outliers.failed(model, replica, f"request failed: {type(exc).__name__}")
            return f"{replica.endpoint} could not be reached ({type(exc).__name__})"
        except AgentSilent as exc:
            return AgentDidNotAnswer(str(exc))
        except EngineFailed as exc:
            return f"{replica.endpoint}'s engine failed to start: {exc}"
        except (TimeoutError, httpx.TimeoutException):
            metrics.UPSTREAM_ERRORS.labels(replica.endpoint, "timeout").inc()
            if not replica.healthy:
                # Marked down by its health checks while this request waited: silent, not
                # slow. Nothing reached the client, so another replica may answer it.
                return f"{replica.endpoint} went silent (its health checks fail)"
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
            said = f"{replica.endpoint} answered {status}"
            return NotReady(said) if status == 503 else said
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

    def _headers_for(self, replica: Replica, outgoing: Outgoing) -> list[tuple[bytes, bytes]]:
        """The request's headers with the engine's own credential: what the client sent as
        its key never goes to an engine (the outgoing headers are the gateway's own)."""
        key = self.leases.loaded.credential(replica.endpoint) if self.leases is not None else None
        if key is None:
            return outgoing.headers
        return [*outgoing.headers, (b"authorization", b"Bearer " + key.encode())]

    async def _learned_credential(self, replica: Replica) -> bool:
        return self.leases is not None and await self.leases.loaded.learn_credentials(replica.endpoint)

    async def _attempt(
        self,
        outgoing: Outgoing,
        replica: Replica,
        watch: Disconnect,
        model: str = "",
        ticket: Ticket | None = None,
    ) -> Answer:
        """Ask one replica; return once its first body byte (or its whole, empty answer) is
        here, within one first-byte allowance for the headers and that byte together.

        The request is counted in flight to the replica from here on: the answer holds the
        count, and if there is no answer, the count is given back before the error leaves.
        """
        upstream: Reply | httpx.Response | None = None
        watch.waiting = True
        hold = replica.hold()
        if ticket is not None and ticket.id is not None:
            # The slot goes back with the replica's count, however the answer ends.
            hold.then(functools.partial(ticket.give_back, ticket.id))
        try:
            if replica.agent is not None and self.leases is not None:
                if watch.gone:
                    # Gone before the wait began, so nothing cancels it: asking the agent
                    # now would start (and make room for) an engine nobody waits for.
                    raise ApiError(CLIENT_GONE, "client went away")
                # Held here until its agent has the engine ready (a client that leaves
                # meanwhile cancels the wait); the first-byte allowance starts after.
                with tracing.waiting("engine load", replica.endpoint):
                    lease = await self.leases.lease(model, replica)
                hold.then(functools.partial(self.leases.release, replica, lease))
            # Cut short should health checks mark the replica down meanwhile (Health.waiting).
            async with asyncio.timeout(self.first_byte_timeout) as clock:
                with self.health.waiting(replica, clock):
                    url = replica.urls[outgoing.kind]
                    upstream = await self.upstream.post(
                        url, self._headers_for(replica, outgoing), outgoing.body, self.timeouts
                    )
                    if upstream.status_code == 401 and await self._learned_credential(replica):
                        # The engine was started (or restarted) with a key this worker had
                        # not heard yet: asked once more with the one its agent tells now.
                        await upstream.aclose()
                        upstream = await self.upstream.post(
                            url, self._headers_for(replica, outgoing), outgoing.body, self.timeouts
                        )
                    chunks = upstream.aiter_raw()
                    if upstream.status_code in _REPLICA_TROUBLE:
                        return Answer(upstream, hold, chunks, b"")  # not read: it is retried
                    if upstream.status_code >= 500:
                        # Read whole, in case it is passed on: whether it is, only the next
                        # replica's answer can tell.
                        error = await read_error(chunks)
                        await upstream.aclose()
                        return Answer(upstream, hold, no_chunks(), error)
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


def _named(
    served: str, requested: str, body: bytes, request: dict[str, Any], rewritten: dict[str, bytes]
) -> bytes:
    """The body as this replica's engine must read it: naming the model as the engine serves
    it, written once per served name however many replicas are tried."""
    if served == requested:
        return body
    content = rewritten.get(served) or json.dumps({**request, "model": served}).encode()
    rewritten[served] = content
    return content
