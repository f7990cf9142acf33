"""`llmgw node status`: an agent's /status document → the table a person reads."""

from __future__ import annotations

from typing import Any

_HEADINGS = (
    "MODEL",
    "PROFILE",
    "ENDPOINT",
    "START",
    "STATE",
    "PID",
    "IN FLIGHT",
    "STARTS",
    "RESTARTS",
    "LOG",
    "MESSAGE",
)


def status_lines(doc: dict[str, Any]) -> list[str]:
    """The node, its memory, and a row per replica; the message last and unpadded, since it
    is the longest and the one a person reads whole."""
    lines = [f"node {doc['node']}, plan {doc['plan_digest']}"]
    memory = doc.get("memory")  # absent from an agent older than on-demand replicas
    if memory and memory.get("total_gb") is not None:
        free = memory["available_gb"]
        lines.append(
            f"memory: {memory['always_on_gb']:g} GB always-on + {memory['on_demand_gb']:g} GB on demand "
            f"of {memory['total_gb']:g} GB; the machine has "
            + ("unknown" if free is None else f"{free:.1f} GB")
            + " available"
        )
    rows: list[tuple[str, ...]] = [_HEADINGS, *(_row(r) for r in doc["replicas"])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADINGS) - 1)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return lines


def _row(replica: dict[str, Any]) -> tuple[str, ...]:
    on_demand = replica.get("start") == "on-demand"
    return (
        replica["model"],
        replica["profile"],
        replica["endpoint"],
        "on-demand" if on_demand else "always",
        replica["state"],
        str(replica["pid"] or "-"),
        str(replica["in_flight"]) if on_demand else "-",
        str(replica.get("starts", "-")),
        str(replica["restarts"]),
        replica.get("log") or "-",  # where to look when the message is not enough
        replica["message"] or "",
    )
