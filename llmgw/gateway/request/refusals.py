"""Why a request got no answer from any replica, as the sentences the client reads: none in
rotation, every one still loading, its agent silent, every one failed, or the retry budget
spent. The retry loop (request/proxy.py) decides; this module says it.
"""

from __future__ import annotations

from llmgw.gateway.errors import ApiError
from llmgw.gateway.state.routes import Model


class NotReady(str):
    """Why a replica did not take a request, when it answered 503: llama.cpp and vLLM say
    so while they load the weights. Not ready yet, not broken: when every replica says it,
    the client is told to come back (503, Retry-After), not that they failed (502)."""


class AgentDidNotAnswer(NotReady):
    """Why an on-demand replica did not take a request: its node's agent does not answer."""


def none_answered(model: Model, tried: int, not_ready: int, last: str, retry_after: str) -> ApiError:
    """Why no replica answered: none in rotation, every one still loading, or every one failed."""
    if not tried:
        return ApiError(
            503,
            f"No replica of {model.name} is in rotation right now"
            + ("" if model.has_replicas() else " (the plan places none)")
            + f". Retry in {retry_after}s; /dashboard shows replica health.",
            type="service_unavailable",
            code="no_healthy_replica",
            headers={"Retry-After": retry_after},
        )
    if isinstance(last, AgentDidNotAnswer) and not_ready == tried:
        return ApiError(
            503,
            f"{model.name} starts on demand, and {last} Retry in {retry_after}s; "
            "start `llmgw node` there (or make it reachable), or place the model on another node.",
            type="service_unavailable",
            code="agent_unreachable",
            headers={"Retry-After": retry_after},
        )
    if not_ready == tried:
        return ApiError(
            503,
            f"{model.name} is not ready yet: its engine is still loading ({last}). "
            f"Retry in {retry_after}s; /dashboard shows when it is in rotation.",
            type="service_unavailable",
            code="model_not_ready",
            headers={"Retry-After": retry_after},
        )
    return ApiError(
        502,
        f"Every replica of {model.name} failed ({tried} tried; last: {last}). "
        "Retry shortly; if it persists, the engines need attention.",
        type="upstream_error",
        code="upstream_unreachable",
    )


def budget_spent(model: Model, last: str) -> ApiError:
    """Why a request was not tried elsewhere: too many are failing (the retry budget)."""
    return ApiError(
        502,
        f"{model.name} could not answer: {last}. The gateway did not try another "
        "replica because many requests are failing right now (its retry budget "
        "is spent); retry shortly.",
        type="upstream_error",
        code="upstream_unreachable",
    )
