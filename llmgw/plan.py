"""Resolve, digest, write and read the plan: the one file the gateway reads.

A plan is a promise: it lists only replicas that were placed, with every default
filled in, so that nothing downstream has to know the catalogue's rules.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from llmgw.errors import PlanError
from llmgw.schema import validator

FORMAT_VERSION = "1"


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def plan_digest(plan: dict[str, Any]) -> str:
    """sha256 of the plan's canonical JSON without its own digest key."""
    body = {k: v for k, v in plan.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def dump_plan(plan: dict[str, Any]) -> str:
    # Keys keep the order build_plan gave them, so a diff of two plans reads
    # top-down like the catalogue; the digest does not depend on that order.
    return json.dumps(plan, indent=2, ensure_ascii=False) + "\n"


def check_plan(doc: Any, where: str = "the plan") -> dict[str, Any]:
    """Return `doc` when it is a valid plan whose digest matches; else PlanError, a sentence."""
    if not isinstance(doc, dict):
        raise PlanError(f"{where} is not a JSON object; write it with `llmgw plan`.")
    errors = sorted(validator("plan").iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        at = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise PlanError(
            f"{where} does not match schema/plan.schema.json at {at}: {first.message}{more}. "
            "Write plans with `llmgw plan` rather than by hand."
        )
    expected = plan_digest(doc)
    if doc["digest"] != expected:
        raise PlanError(
            f"{where} says its digest is {doc['digest']} but its content hashes to {expected}: "
            "it was edited after `llmgw plan` wrote it. Run `llmgw plan` again instead of editing it."
        )
    return doc


def parse_plan(text: str | bytes, where: str = "the plan") -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{where} is not valid JSON ({exc}); write it with `llmgw plan`.") from None
    return check_plan(doc, where)


def read_plan(path: Path | str) -> dict[str, Any]:
    """Read and check a plan file; PlanError says what is wrong with it."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read plan {path}: {exc.strerror or exc}.") from None
    return parse_plan(text, where=str(path))
