"""Plans around hand-picked parts, for tests that read plans rather than make them.

Built through `llmgw.plan.assemble_plan`, from the types every reader gets: a renamed field
fails here, not in a test that happens to read it.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.plan import FileRef, Inputs, Plan, PlanModel, PlanNode, assemble_plan


def plan_of(models: Iterable[PlanModel], nodes: Iterable[PlanNode] = (), fleet_sha: str = "0" * 64) -> Plan:
    """The models in the order given, and the digest filled in."""
    inputs = Inputs(catalog="catalog", fleet=FileRef(path="fleet.yaml", sha256=fleet_sha), files=())
    return assemble_plan(models, nodes, inputs=inputs)
