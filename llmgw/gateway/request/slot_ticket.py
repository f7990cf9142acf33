"""A request's place in line for a replica's slot (gateway/schedule/), as the proxy asks for
it: one ticket per model tried, and the candidate whose slot it was granted."""

from __future__ import annotations

import asyncio

from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.context import RequestContext
from llmgw.gateway.request.disconnect import CLIENT_GONE, Disconnect
from llmgw.gateway.schedule import Scheduler, Ticket
from llmgw.gateway.state.routes import Model, Profile, Replica
from llmgw.plan import Plan


def ticket_for(scheduler: Scheduler | None, model: Model, ctx: RequestContext) -> Ticket | None:
    """The request's place in line for a slot of `model`."""
    if scheduler is None:
        return None
    tenant = ctx.tenant
    key, share = (tenant.name, tenant.share) if tenant is not None else ("anonymous", 1.0)
    # Charged its prompt when granted a slot, and its answer's tokens as it ends: charged its
    # max_tokens up front, a key of short answers paid for long ones until each ended.
    return scheduler.ticket(model.name, key, ctx.band, share, ctx.prompt_estimate)


async def take_slot(
    ticket: Ticket, candidates: list[tuple[Profile, Replica]], watch: Disconnect, plan: Plan
) -> tuple[Profile, Replica]:
    """The candidate whose slot the request was granted, taken out of `candidates`; the
    wait is cancelled (and the line left) when the client goes."""
    slots: dict[str, int] = {}
    for profile, replica in candidates:
        slots.setdefault(replica.endpoint, profile.slots)
    rooms = ticket.scheduler.rooms(plan)
    watch.waiting = True
    try:
        endpoint = await ticket.take(slots, {e: rooms[e] for e in slots if e in rooms} if rooms else None)
    except asyncio.CancelledError:
        if watch.absorb():
            raise ApiError(CLIENT_GONE, "client went away") from None
        raise
    finally:
        watch.waiting = False
    index = next(i for i, (_, replica) in enumerate(candidates) if replica.endpoint == endpoint)
    return candidates.pop(index)
