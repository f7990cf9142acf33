"""`llmgw status`: the fleet judged against the plan → a table for people, JSON for machines."""

from __future__ import annotations

import json
from typing import TextIO

from llmgw.status import FleetStatus, ReplicaStatus


def report_text(status: FleetStatus, stream: TextIO) -> None:
    """A row per model with its two words, then a line per replica that keeps it from being
    Synced and Healthy, saying why; unanswered agents last."""
    rows = [("MODEL", "SYNC", "HEALTH", "REPLICAS")]
    for model in status.models:
        up = sum(1 for r in model.replicas if r.health == "Healthy")
        rows.append((model.name, model.sync, model.health, f"{up}/{len(model.replicas)} ready"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print(f"plan {status.digest}", file=stream)
    for row in rows:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        print(f"{cells}  {row[3]}", file=stream)
    problems = [r for m in status.models for r in m.replicas if not _fine(r)]
    for replica in problems:
        print(f"  {_line(replica)}", file=stream)
    if not status.models:
        print("the plan places no replica on a node agent", file=stream)
    verdict = "the fleet runs the plan" if status.ok else "the fleet does not run the plan yet"
    print(verdict, file=stream)


def _fine(replica: ReplicaStatus) -> bool:
    return replica.sync == "Synced" and replica.health in ("Healthy", "Suspended")


def _line(replica: ReplicaStatus) -> str:
    state = f" ({replica.state})" if replica.state else ""
    why = f": {replica.message}" if replica.message else ""
    return (
        f"{replica.model}/{replica.profile} {replica.endpoint} on {replica.node}: "
        f"{replica.sync}, {replica.health}{state}{why}"
    )


def report_json(status: FleetStatus, stream: TextIO) -> None:
    print(json.dumps(status.document(), indent=2), file=stream)


REPORTERS = {"text": report_text, "json": report_json}
