"""What every engine says of itself, and the parts engines share.

An engine is one module in llmgw/engines/ whose ENGINE is an `Engine`: the node agent, the
renderers, the memory estimate, placement and the lint rules all ask it, and none of them
names an engine. What is not said here is the same for every engine.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import ClassVar, Literal
from urllib.parse import urlparse

from llmgw.hub import hub_source
from llmgw.model import Architecture, Profile, arg_value
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

# Why llmgw's own setting stands, for the flags every engine has in some spelling.
OWNED_ADDRESS = (
    "the address is the node's (fleet.yaml nodes[].address), where the gateway reaches the "
    "engine and asks for a key in front of it; remove it"
)
OWNED_PORT = (
    "the port is chosen from the node's range (fleet.yaml nodes[].ports) and written in the "
    "plan, the only port the gateway routes to; remove it"
)
OWNED_NAME = "clients reach the model by the model file's `name` and `aliases`; add the name there"
OWNED_MODEL = "the engine loads the model file's `source`; point source at these weights instead"
OWNED_KEY = (
    "the node agent gives each engine a credential of its own, which only the gateway learns, "
    "so no one else on the network can use the engine; remove it"
)


# A decimal gigabyte, the unit of every memory figure in the plan and the inventory: a node's
# size and a replica's estimate compare in the same unit.
GB = 1_000_000_000


@dataclass(frozen=True)
class Memory:
    """One replica's memory figure and where it came from (llmgw.compiler.memory explains the three ways)."""

    gb: float
    source: Literal["declared", "estimated"]
    basis: str


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's environment


class Engine(ABC):
    """One engine: its command line, probes, slots, memory rule, image and executable."""

    name: ClassVar[str]  # as the catalogue's `engine:` spells it
    program: ClassVar[str]  # the executable looked for on a node's PATH
    environ_key: ClassVar[str]  # the variable that points the agent at another executable
    install_hint: ClassVar[str]  # how to get one, said when none is found
    reads: ClassVar[frozenset[str]]  # weight formats it loads (llmgw.compiler.source.Format)
    needs_gpu: ClassVar[bool] = False  # a profile asks for a GPU unless it says otherwise
    shares_context_pool: ClassVar[bool] = False  # given ctx_size, which its slots divide
    # Embeds only with a pooling type: the GGUF's own, or --pooling in the args.
    needs_pooling_type: ClassVar[bool] = False
    image: ClassVar[str]  # its container image for `llmgw render kubernetes`
    gpu_image: ClassVar[str | None] = None  # the build a profile with GPUs needs, if another
    image_program: ClassVar[str]  # where the image keeps the executable
    # Ready is a 200 here; anything else that answers is still loading (llama.cpp and vLLM
    # both answer 503 while the weights load), and no answer at all is still starting.
    health_path: ClassVar[str] = "/health"
    # An idle engine that keeps nothing an orderly exit would save is stopped with SIGKILL
    # when evicted or idle-stopped: its SIGTERM exit is time a swap waits for.
    killed_when_idle: ClassVar[bool] = False
    # Flag → why llmgw's own setting must stand (args-owned), and flag → what it lets the
    # engine do beyond answering requests (args-risky).
    owned_flags: ClassVar[Mapping[str, str]] = {}
    risky_flags: ClassVar[Mapping[str, str]] = {}

    @abstractmethod
    def command(
        self,
        model: PlanModel,
        profile: PlanProfile,
        replica: PlanReplica,
        *,
        weights: str,
        host: str,
        port: int,
        exe: str,
    ) -> EngineCommand:
        """The command line for one replica, before the profile's own args."""

    def with_credential(self, command: EngineCommand, key_file: str, key: str) -> EngineCommand:
        """The command with the engine's own credential, so it answers only the gateway: read
        from a file or the environment, never the command line, which `ps` shows anyone. An
        engine that takes no key keeps its command, and answers whoever reaches its port."""
        return command

    @abstractmethod
    def slots(self, args: tuple[str, ...]) -> int:
        """How many requests the engine runs at once with these args."""

    def context_slots(self, args: tuple[str, ...]) -> int:
        """How many parts the engine splits ctx_size into, one a request: 1 for a shared pool."""
        return 1

    def ready(self, status: int) -> bool:
        return status == 200

    def memory(
        self, arch: Architecture, profile: Profile, ctx: int, weights: int, source: str
    ) -> Memory | None:
        """The engine's own estimate when it has one for this architecture; None: the rough rule."""
        return None

    def flag_of(self, arg: str) -> str | None:
        """The flag an argument spells (`--port=1` and `--port` alike), or None for a value."""
        if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
            return None  # a value, such as -1 for "no limit"
        return arg.partition("=")[0]

    def find(self, path: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
        """The executable on this machine, or None and a sentence saying how to get one."""
        configured = environ.get(self.environ_key)
        found = shutil.which(configured or self.program, path=path)
        if found:
            return found, ""
        if configured:
            return None, (
                f"{self.environ_key}={configured} is not an executable file; point it at {self.program}."
            )
        return None, self.install_hint


def count_in(args: tuple[str, ...], *flags: str) -> int | None:
    """A positive count given by the last of `flags`, or None when absent or not one."""
    value = arg_value(args, *flags)
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def fetched_weights(source: str, directory: str) -> str | None:
    """Where `llmgw fetch SOURCE --into DIRECTORY` leaves a model's weights: what a renderer
    hands the engine. None for a local path, which only the machine that has it can read."""
    hub = hub_source(source)
    if hub is not None:
        # A repository is fetched whole, and vLLM is given its folder.
        return directory if hub.filename is None else f"{directory}/{hub.filename}"
    if source.startswith(("https://", "http://")):
        return f"{directory}/{PurePosixPath(urlparse(source).path).name or 'weights'}"
    return None
