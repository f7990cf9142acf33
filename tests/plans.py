"""A plan document around hand-made models, for tests that read plans rather than make them."""

from __future__ import annotations

import copy
from typing import Any

from llmgw.plan import plan_digest


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
