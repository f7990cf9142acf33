"""Small valid plans built from typed parts, so diff tests do not depend on the compiler's placement."""

from __future__ import annotations

from llmgw.plan import (
    NodeUse,
    Plan,
    PlanMemory,
    PlanModel,
    PlanNode,
    PlanProfile,
    PlanReplica,
    PortRange,
)
from tests.plans import plan_of

FILE_SHA = "0" * 64


def node(
    name: str,
    address: str,
    memory_gb: float = 64,
    *,
    gpus: int = 0,
    engines: tuple[str, ...] | None = ("llamacpp",),
    replicas_placed: int = 0,
) -> PlanNode:
    return PlanNode(
        name=name,
        address=address,
        memory_gb=memory_gb,
        gpus=gpus,
        gpu_memory_gb=0,
        labels={"pool": "cpu"},
        engines=engines,
        ports=PortRange(first=8001, last=8099),
        used=NodeUse(memory_gb=0, gpus=0, replicas=replicas_placed),
    )


def replica(node_name: str, address: str, port: int) -> PlanReplica:
    return PlanReplica(endpoint=f"http://{address}:{port}", node=node_name, port=port)


def model(
    name: str,
    replicas: list[PlanReplica],
    description: str | None = "General chat.",
    *,
    aliases: tuple[str, ...] = (),
    context_length: int = 8192,
    max_output: int | None = None,
    ctx_size: int = 8192,
) -> PlanModel:
    profile = PlanProfile(
        name="cpu",
        engine="llamacpp",
        priority=100,
        weight=1,
        ctx_size=ctx_size,
        args=(),
        gpus=0,
        node_selector={"pool": "cpu"},
        memory=PlanMemory(gb=8, source="estimated", basis="weights and KV cache"),
        served_name=name,
        external=False,
        replicas=tuple(replicas),
    )
    return PlanModel(
        name=name,
        description=description,
        aliases=aliases,
        task="chat",
        source=f"hf://example/{name}",
        format="repository",
        context_length=context_length,
        max_output=max_output,
        replicas=max(1, len(replicas)),
        file=f"catalog/{name}.yaml",
        profiles=(profile,),
        warnings=(),
    )


def plan(models: list[PlanModel], nodes: list[PlanNode], fleet_sha: str = FILE_SHA) -> Plan:
    # Sorted by name, as `llmgw plan` writes them.
    return plan_of(sorted(models, key=lambda m: m.name), nodes, fleet_sha=fleet_sha)


CPU = [node("cpu-1", "127.0.0.11"), node("cpu-2", "127.0.0.12"), node("cpu-3", "127.0.0.13")]


def base_and_head() -> tuple[Plan, Plan]:
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
