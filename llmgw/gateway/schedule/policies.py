"""The scheduling policies by name, as LLMGW_SCHEDULER names them."""

from __future__ import annotations

from llmgw.errors import UsageError
from llmgw.gateway.schedule.fair import FAIR
from llmgw.gateway.schedule.fifo import FIFO
from llmgw.gateway.schedule.policy import Policy

POLICIES: dict[str, Policy] = {p.name: p for p in (FAIR, FIFO)}
DEFAULT = "fair"


def policy_named(name: str) -> Policy:
    """The policy LLMGW_SCHEDULER names, or a sentence listing the ones there are."""
    policy = POLICIES.get(name.strip().lower())
    if policy is None:
        choices = " or ".join(f"{p.name} ({p.summary})" for p in POLICIES.values())
        raise UsageError(f"LLMGW_SCHEDULER={name!r} is not a scheduler; set it to {choices}.")
    return policy
