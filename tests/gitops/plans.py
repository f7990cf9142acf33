"""Small valid plans built by hand, so diff tests do not depend on the compiler's placement."""

from __future__ import annotations

from typing import Any

from tests.plans import plan_document

FILE_SHA = "0" * 64


def node(name: str, address: str, memory_gb: float = 64, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name,
        "address": address,
        "memory_gb": memory_gb,
        "gpus": 0,
        "gpu_memory_gb": 0,
        "labels": {"pool": "cpu"},
        "engines": ["llamacpp"],
        "ports": {"first": 8001, "last": 8099},
        "used": {"memory_gb": 0, "gpus": 0, "replicas": 0},
    }
    doc.update(extra)
    return doc


def replica(node_name: str, address: str, port: int) -> dict[str, Any]:
    return {"endpoint": f"http://{address}:{port}", "node": node_name, "port": port}


def model(
    name: str,
    replicas: list[dict[str, Any]],
    description: str | None = "General chat.",
    **extra: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name}
    if description is not None:
        doc["description"] = description
    doc.update(
        {
            "aliases": [],
            "task": "chat",
            "source": f"hf://example/{name}",
            "format": "repository",
            "context_length": 8192,
            "replicas": max(1, len(replicas)),
            "file": f"catalog/{name}.yaml",
            "profiles": [
                {
                    "name": "cpu",
                    "engine": "llamacpp",
                    "priority": 100,
                    "weight": 1,
                    "ctx_size": 8192,
                    "args": [],
                    "gpus": 0,
                    "node_selector": {"pool": "cpu"},
                    "memory": {"gb": 8, "source": "estimated", "basis": "weights and KV cache"},
                    "served_name": name,
                    "external": False,
                    "replicas": replicas,
                }
            ],
            "warnings": [],
        }
    )
    doc.update(extra)
    return doc


def plan(models: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    # Sorted by name, as `llmgw plan` writes them.
    return plan_document(sorted(models, key=lambda m: m["name"]), nodes, fleet_sha=FILE_SHA)


CPU = [node("cpu-1", "127.0.0.11"), node("cpu-2", "127.0.0.12"), node("cpu-3", "127.0.0.13")]


def base_and_head() -> tuple[dict[str, Any], dict[str, Any]]:
    """The example from the README: one model added, one changed, one removed."""
    base = plan(
        [
            model(
                "llama-3.1-8b",
                [replica("cpu-1", "127.0.0.11", 8001), replica("cpu-2", "127.0.0.12", 8001)],
                description="General chat.",
            ),
            model("mistral-7b-instruct", [replica("cpu-3", "127.0.0.13", 8001)], description=None),
        ],
        CPU,
    )
    head = plan(
        [
            model(
                "llama-3.1-8b",
                [
                    replica("cpu-2", "127.0.0.12", 8002),
                    replica("cpu-2", "127.0.0.12", 8001),
                    replica("cpu-3", "127.0.0.13", 8002),
                ],
                description="General chat, fast and cheap.",
            ),
            model("phi-4", [replica("cpu-1", "127.0.0.11", 8001)]),
        ],
        CPU,
    )
    return base, head
