"""Typed catalogue and fleet, built from documents the schema has already accepted.

The schema decides what is valid; these classes only give the rest of the
pipeline names and types to work with, and fill in the schema's defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

# One of llmgw.engines.names(): the model schema lists them, and checks it first.
Engine = str
Task = Literal["chat", "completion", "embedding", "rerank"]
Routing = Literal["prefix", "least-loaded"]
Start = Literal["always", "on-demand"]

DEFAULT_IDLE_STOP = "10m"
DEFAULT_AGENT_PORT = 9100
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def duration_s(text: str) -> int:
    """`90s`, `10m`, `2h` (as the schema allows them) in seconds."""
    return int(text[:-1]) * _SECONDS[text[-1]]

DEFAULT_PORTS = (8001, 8099)



def arg_value(args: tuple[str, ...], *flags: str) -> str | None:
    """The value after the last of `flags` in args (`--parallel 4` or `--parallel=4`)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Architecture(_Frozen):
    """What the memory estimate needs of a model's shape: written in the model file, or read
    from its GGUF header (`llmgw inspect` prints it, and --write fills it in)."""

    name: str | None = None
    layers: int
    heads: int | None = None
    kv_heads: int
    head_dim: int  # the key's size per head
    value_dim: int | None = None  # the value's, when it differs
    kv_bytes: float | None = None  # None: f16, unless the profile's --cache-type-k/-v say otherwise
    sliding_window: int | None = None
    sliding_window_layers: int = 0  # layers that attend to the window only
    embedding_length: int | None = None
    feed_forward_length: int | None = None
    vocab_size: int | None = None
    trained_context: int | None = None

    @property
    def value_size(self) -> int:
        return self.value_dim or self.head_dim

    @property
    def local_layers(self) -> int:
        return min(self.sliding_window_layers, self.layers) if self.sliding_window else 0

    @property
    def sized(self) -> bool:
        """Enough to size llama.cpp's compute buffers, rather than guess them from the weights."""
        return bool(self.embedding_length and self.feed_forward_length and self.vocab_size)


class Profile(_Frozen):
    name: str
    engine: Engine
    ctx_size: int | None = None
    args: tuple[str, ...] = ()
    min_memory_gb: float | None = None
    gpus: int | None = None
    node_selector: dict[str, str] = {}
    weight: int = 1
    priority: int = 100
    replicas: int | None = None
    endpoints: tuple[str, ...] | None = None
    routing: Routing | None = None
    start: Start = "always"
    idle_stop: str | None = None

    @property
    def on_demand(self) -> bool:
        return self.start == "on-demand"

    @property
    def idle_stop_s(self) -> int:
        return duration_s(self.idle_stop or DEFAULT_IDLE_STOP)

    @property
    def external(self) -> bool:
        return self.endpoints is not None

    def arg_value(self, *flags: str) -> str | None:
        return arg_value(self.args, *flags)


class ModelSpec(_Frozen):
    name: str
    description: str | None = None
    aliases: tuple[str, ...] = ()
    task: Task = "chat"
    source: str
    weights_bytes: int | None = None
    architecture: Architecture | None = None
    context_length: int
    max_output: int | None = None
    replicas: int = 1
    profiles: tuple[Profile, ...]
    fallbacks: tuple[str, ...] = ()  # models that answer, in order, when this one cannot

    def routing_for(self, profile: Profile) -> Routing:
        """Prefix routing pays where prompts repeat (a conversation's earlier turns, a shared
        system prompt) and the engine caches them; an embedding or a rerank has nothing to reuse."""
        if profile.routing is not None:
            return profile.routing
        return "least-loaded" if self.task in ("embedding", "rerank") else "prefix"

    def replicas_for(self, profile: Profile) -> int:
        return profile.replicas if profile.replicas is not None else self.replicas

    def routing_order(self) -> list[Profile]:
        # Lower priority first, as with DNS SRV records; ties keep the file's order.
        return sorted(self.profiles, key=lambda p: p.priority)


class GPUs(_Frozen):
    count: int
    memory_gb: float


class Ports(_Frozen):
    first: int = DEFAULT_PORTS[0]
    last: int = DEFAULT_PORTS[1]


class Node(_Frozen):
    name: str
    address: str
    memory_gb: float
    gpus: GPUs | None = None
    labels: dict[str, str] = {}
    # None: an older agent that reports nothing. Unknown, not "none installed".
    engines: tuple[str, ...] | None = None
    ports: Ports = Ports()
    agent_port: int = DEFAULT_AGENT_PORT

    @property
    def agent(self) -> str:
        """Where this node's agent listens: the gateway asks it there to start engines."""
        return f"http://{self.address}:{self.agent_port}"

    @property
    def gpu_count(self) -> int:
        return self.gpus.count if self.gpus else 0

    @property
    def gpu_memory_gb(self) -> float:
        return self.gpus.memory_gb if self.gpus else 0.0

    def matches(self, selector: dict[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in selector.items())

    def reports(self, engine: str) -> bool | None:
        """True/False when the agent reports engines; None when it reports nothing."""
        return None if self.engines is None else engine in self.engines


class Fleet(_Frozen):
    nodes: tuple[Node, ...]
    file: str = "fleet.yaml"
    # Thousands of profiles share a handful of selectors; each is answered once.
    _matching: dict[tuple[tuple[str, str], ...], list[Node]] = PrivateAttr(default_factory=dict)

    def matching(self, selector: dict[str, str]) -> list[Node]:
        key = tuple(sorted(selector.items()))
        if key not in self._matching:
            self._matching[key] = [n for n in self.nodes if n.matches(selector)]
        return self._matching[key]
