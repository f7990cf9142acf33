"""Engines: one module each, saying everything llmgw needs to know about it; one lookup.

    base.py       what an engine says (`Engine`), and what engines share
    llamacpp.py   llama.cpp's llama-server: one GGUF file
    vllm.py       vLLM: safetensors or a hub repository, on GPUs

`engine(name)` finds the module named for the engine and returns its ENGINE, so a new
engine is one new module (plus its name in the model and plan schemas' `engine` enums, which
say what a catalogue may ask for). Modules are imported when first asked for: the memory
estimate that llama.cpp's module uses asks the registry in turn.

The node agent runs `engine_command`, and every renderer for another orchestrator writes it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pkgutil
from collections.abc import Mapping

from llmgw.engines.base import Engine, EngineCommand, fetched_weights
from llmgw.errors import UsageError
from llmgw.model import ModelSpec, Profile
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

__all__ = [
    "Engine",
    "EngineCommand",
    "ctx_size_for",
    "engine",
    "engine_command",
    "executable_for",
    "fetched_weights",
    "gpus_for",
    "names",
    "register",
    "without_gpus",
]

_found: dict[str, Engine] = {}


def names() -> tuple[str, ...]:
    """Every engine there is a module for, sorted."""
    modules = (m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")
    return tuple(sorted({*modules, *_found}))


def engine(name: str) -> Engine:
    """The engine the catalogue calls `name`; a sentence naming the known ones for any other."""
    if name not in _found:
        if name not in names():
            raise UsageError(
                f"engine {name!r} is not one this llmgw knows ({', '.join(names())}); use one of "
                "those, or upgrade llmgw on this machine to the version that wrote the plan."
            )
        _found[name] = importlib.import_module(f"{__name__}.{name}").ENGINE
    return _found[name]


def register(found: Engine) -> None:
    """Add an engine that has no module here (a test's, or a plugin's)."""
    _found[found.name] = found


def executable_for(
    name: str, *, path: str | None = None, environ: Mapping[str, str] = os.environ
) -> tuple[str | None, str]:
    """The engine's executable on this machine, or None and a sentence saying how to get one.

    One rule for the node agent, which runs it, and for `llmgw inventory` and `llmgw up`,
    which report it. `path` stands in for PATH.
    """
    return engine(name).find(path, environ)


def engine_command(
    model: PlanModel,
    profile: PlanProfile,
    replica: PlanReplica,
    *,
    weights: str,
    host: str,
    port: int | None = None,
    executable: str | None = None,
) -> EngineCommand:
    """The engine's command line for one replica, the profile's args last.

    `weights` is what the engine loads: a GGUF file on the node for llama.cpp, a file or a
    repository id for vLLM. The port and context are always given, never left to the engine's
    defaults: newer llama-server builds changed both (8080 and the model's trained context).
    """
    port = port if port is not None else replica.port
    if port is None:
        raise ValueError(f"replica {replica.endpoint} of {model.name} has no port: it is not placed")
    found = engine(profile.engine)
    command = found.command(
        model, profile, replica, weights=weights, host=host, port=port, exe=executable or found.program
    )
    return EngineCommand((*command.argv, *profile.args), command.env)


def replica_fingerprint(model: PlanModel, profile: PlanProfile, replica: PlanReplica, host: str) -> str:
    """What decides whether a running engine still matches the plan: its command line as the
    plan gives it (the source, not the downloaded path) and the expected weights. The agent
    keeps an engine whose fingerprint is unchanged, and reports it, so `llmgw status` can say
    whether the engine running is the one the plan asks for."""
    command = engine_command(model, profile, replica, weights=model.source, host=host)
    text = json.dumps([command.argv, command.env, model.weights_bytes])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def without_gpus(name: str) -> str:
    """What to do when engine `name` needs a GPU and the fleet has none: one sentence, for lint
    and placement alike."""
    cpu = " or ".join(n for n in names() if not engine(n).needs_gpu)
    return (
        f" {name} needs a GPU and this fleet has none: a GGUF build of the same model runs on "
        f"the CPU nodes with engine {cpu}."
    )


def gpus_for(profile: Profile) -> int:
    """The GPUs a profile asks for: its own `gpus`, else one for an engine that needs a GPU."""
    if profile.gpus is not None:
        return profile.gpus
    return 1 if engine(profile.engine).needs_gpu else 0


def ctx_size_for(spec: ModelSpec, profile: Profile) -> int:
    """The engine's context pool: enough for every slot to take a full request by default."""
    if profile.ctx_size is not None:
        return profile.ctx_size
    return spec.context_length * engine(profile.engine).context_slots(profile.args)
