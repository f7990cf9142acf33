"""Which on-demand replicas share a node with room for one of them at a time (policy.Room).

Read from the plan: a node's on-demand replicas, each with the memory its profile says it
takes, against what the node has beside its always-on replicas. When even the two smallest
do not fit together, only one runs at a time, and starting one stops another: those
replicas are one Room, and the scheduler serves them swap-aware. On a node where two fit,
the agent makes room as it always has, with no Room.
"""

from __future__ import annotations

from llmgw.plan import Plan


def rooms_of(plan: Plan) -> dict[str, str]:
    """Endpoint → the name of its Room, for the on-demand replicas that are in one."""
    on_node: dict[str, list[tuple[str, float]]] = {}
    for model in plan.models:
        for profile in model.profiles:
            if not profile.on_demand or profile.memory is None:
                continue
            for replica in profile.replicas:
                if replica.node is not None:
                    on_node.setdefault(replica.node, []).append((replica.endpoint, float(profile.memory.gb)))
    rooms: dict[str, str] = {}
    for node in plan.nodes:
        replicas = on_node.get(node.name, [])
        if len(replicas) < 2:
            continue
        room = float(node.memory_gb) - float(node.used.memory_gb)
        smallest = sorted(gb for _, gb in replicas)[:2]
        if sum(smallest) > room:
            rooms.update((endpoint, f"node:{node.name}") for endpoint, _ in replicas)
    return rooms
