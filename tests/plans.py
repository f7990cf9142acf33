"""Plans around hand-picked parts, for tests that read plans rather than make them.

Built through `llmgw.plan.assemble_plan`, from the types every reader gets: a renamed field
fails here, not in a test that happens to read it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from llmgw.plan import FileRef, Inputs, Plan, PlanModel, PlanNode, assemble_plan, plan_digest


def plan_of(models: Iterable[PlanModel], nodes: Iterable[PlanNode] = (), fleet_sha: str = "0" * 64) -> Plan:
    """The models in the order given, and the digest filled in."""
    inputs = Inputs(catalog="catalog", fleet=FileRef(path="fleet.yaml", sha256=fleet_sha), files=())
    return assemble_plan(models, nodes, inputs=inputs)


def plan_document(
    models: list[dict[str, Any]], nodes: list[dict[str, Any]] | None = None, fleet_sha: str = "0" * 64
) -> dict[str, Any]:
    """The models in the order given, and the digest filled in."""
    doc: dict[str, Any] = {
        "format_version": "1",
        "digest": "",
        "generated_by": {"tool": "llmgw", "version": "0.1.0"},
        "inputs": {
            "catalog": "catalog",
            "fleet": {"path": "fleet.yaml", "sha256": fleet_sha},
            "files": [],
        },
        "nodes": copy.deepcopy(nodes or []),
        "models": copy.deepcopy(models),
    }
    doc["digest"] = plan_digest(doc)
    return doc
