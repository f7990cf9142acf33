"""Schema-valid plans for dashboard tests, built in code so each test says what it needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.plan import plan_digest
from tests.plans import plan_document

REPO = Path(__file__).resolve().parents[2]

LONG_DESCRIPTION = (
    "Long-context chat for whole repositories and contracts. "
    + "It keeps going and going, because some catalogue authors write essays. " * 25
    + "An unbreakable token follows: "
    + "https://127.0.0.1/" + "x" * 180
)
HOSTILE_DESCRIPTION = (
    '<script>window.__pwned = "script"</script>'
    '<img src="x" onerror="window.__pwned = \'img\'"> & friends'
)


def make_profile(
    name: str, endpoints: list[str], *, engine: str = "llamacpp", external: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "engine": engine,
        "priority": 100,
        "weight": 1,
        "ctx_size": 8192,
        "args": [],
        "gpus": 0,
        "node_selector": {},
        "memory": {"gb": 6.0, "source": "estimated", "basis": "weights plus KV pool"},
        "served_name": name,
        "external": external,
        "replicas": [{"endpoint": e} for e in endpoints],
    }


def make_model(
    name: str,
    profiles: list[dict[str, Any]],
    *,
    description: str | None = "A model for tests.",
    aliases: list[str] | None = None,
    task: str = "chat",
    context_length: int = 8192,
) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": name,
        "aliases": aliases or [],
        "task": task,
        "source": f"hf://example/{name}",
        "format": "gguf",
        "context_length": context_length,
        "replicas": sum(len(p["replicas"]) for p in profiles) or 1,
        "file": f"catalog/{name}.yaml",
        "profiles": profiles,
        "warnings": [],
    }
    if description is not None:
        model["description"] = description
    return model


def make_plan(models: list[dict[str, Any]]) -> dict[str, Any]:
    return plan_document(models)


def sample_models(endpoints: list[str]) -> list[dict[str, Any]]:
    """Four models covering what the page must get right, on the given endpoints
    (at least six: two for the first model, one each after)."""
    e = endpoints
    return [
        make_model(
            "llama-3.1-8b",
            [make_profile("cpu", [e[0], e[1]])],
            aliases=["llama3", "default"],
            description="General chat, fast and cheap; the default for most requests.",
        ),
        make_model(
            "qwen2.5-32b-long",
            [make_profile("gpu", [e[2]], engine="vllm"), make_profile("cpu", [e[3]])],
            aliases=["qwen", "long"],
            context_length=131072,
            description=LONG_DESCRIPTION,
        ),
        make_model(
            "hostile",
            [make_profile("cpu", [e[4]])],
            aliases=["<b>bold</b>"],
            description=HOSTILE_DESCRIPTION,
        ),
        make_model(
            "nomic-embed",
            [make_profile("cpu", [e[5]])],
            task="embedding",
            context_length=2048,
            description=None,
        ),
    ]


def bundled_plan() -> dict[str, Any]:
    """The plan `llmgw plan` writes for the bundled catalogue and fleet."""
    import llmgw.plan

    if not hasattr(llmgw.plan, "build_plan"):
        pytest.skip("the plan compiler (llmgw.plan.build_plan) is not written yet")
    proc = subprocess.run(
        [sys.executable, "-m", "llmgw", "plan", "catalog", "--fleet", "fleet.yaml", "--out", "-"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"`llmgw plan` failed on the bundled catalogue:\n{proc.stderr}"
    plan: dict[str, Any] = json.loads(proc.stdout)
    return plan


def endpoints_of(plan: dict[str, Any]) -> list[str]:
    seen = [r["endpoint"] for m in plan["models"] for p in m["profiles"] for r in p["replicas"]]
    return list(dict.fromkeys(seen))


def repoint(plan: dict[str, Any], to: dict[str, str]) -> dict[str, Any]:
    """The same plan with replica endpoints replaced (by fake upstreams), digest recomputed."""
    plan = json.loads(json.dumps(plan))
    for m in plan["models"]:
        for p in m["profiles"]:
            for r in p["replicas"]:
                r["endpoint"] = to[r["endpoint"]]
    plan["digest"] = plan_digest(plan)
    return plan
