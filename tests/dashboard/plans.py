"""Schema-valid plans for dashboard tests, built in code so each test says what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Literal

from llmgw.plan import Plan, PlanMemory, PlanModel, PlanProfile, PlanReplica, assemble_plan, parse_plan
from tests.plans import plan_of

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
    name: str,
    endpoints: list[str],
    *,
    engine: Literal["llamacpp", "vllm"] = "llamacpp",
    external: bool = False,
) -> PlanProfile:
    return PlanProfile(
        name=name,
        engine=engine,
        priority=100,
        weight=1,
        ctx_size=8192,
        args=(),
        gpus=0,
        node_selector={},
        memory=PlanMemory(gb=6.0, source="estimated", basis="weights plus KV pool"),
        served_name=name,
        external=external,
        replicas=tuple(PlanReplica(endpoint=e) for e in endpoints),
    )


def make_model(
    name: str,
    profiles: list[PlanProfile],
    *,
    description: str | None = "A model for tests.",
    aliases: list[str] | None = None,
    task: Literal["chat", "completion", "embedding"] = "chat",
    context_length: int = 8192,
) -> PlanModel:
    return PlanModel(
        name=name,
        description=description,
        aliases=tuple(aliases or ()),
        task=task,
        source=f"hf://example/{name}",
        format="gguf",
        context_length=context_length,
        replicas=sum(len(p.replicas) for p in profiles) or 1,
        file=f"catalog/{name}.yaml",
        profiles=tuple(profiles),
        warnings=(),
    )


def make_plan(models: list[PlanModel]) -> Plan:
    return plan_of(models)


def sample_models(endpoints: list[str]) -> list[PlanModel]:
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


def bundled_plan() -> Plan:
    """The plan `llmgw plan` writes for the bundled catalogue and fleet."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmgw", "plan", "catalog", "--fleet", "fleet.yaml", "--out", "-"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"`llmgw plan` failed on the bundled catalogue:\n{proc.stderr}"
    return parse_plan(proc.stdout)


def endpoints_of(plan: Plan) -> list[str]:
    seen = [r.endpoint for m in plan.models for p in m.profiles for r in p.replicas]
    return list(dict.fromkeys(seen))


def repoint(plan: Plan, to: dict[str, str]) -> Plan:
    """The same plan with replica endpoints replaced (by fake upstreams), digest recomputed."""

    def profile(p: PlanProfile) -> PlanProfile:
        replicas = tuple(r.model_copy(update={"endpoint": to[r.endpoint]}) for r in p.replicas)
        return p.model_copy(update={"replicas": replicas})

    models = [m.model_copy(update={"profiles": tuple(profile(p) for p in m.profiles)}) for m in plan.models]
    # assemble_plan checks the result against the schema, so the copies are checked too.
    return assemble_plan(models, plan.nodes, inputs=plan.inputs, target=plan.target)
