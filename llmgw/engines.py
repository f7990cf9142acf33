"""A planned replica → the command line that runs its engine. The one place that knows it:
the node agent calls it, and so does every renderer for another orchestrator.

    llama.cpp   llama-server --model FILE --host ADDRESS --port PORT --ctx-size CTX
                             --alias SERVED_NAME [--embeddings] ARGS...
    vLLM        vllm serve SOURCE --host ADDRESS --port PORT --max-model-len CONTEXT
                           --served-model-name SERVED_NAME ARGS...
                with CUDA_VISIBLE_DEVICES set to the replica's GPUs
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import urlparse

from llmgw.plan import PlanModel, PlanProfile, PlanReplica

DEFAULT_EXECUTABLES = {"llamacpp": "llama-server", "vllm": "vllm"}


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's environment


def fetched_weights(source: str, directory: str) -> str | None:
    """Where `llmgw fetch SOURCE --into DIRECTORY` leaves a model's weights: what a renderer
    hands the engine. None for a local path, which only the machine that has it can read."""
    if source.startswith("hf://"):
        parts = [p for p in source[len("hf://") :].split("/") if p]
        # A repository is fetched whole, and vLLM is given its folder.
        return "/".join([directory, *parts[2:]])
    if source.startswith(("https://", "http://")):
        return f"{directory}/{PurePosixPath(urlparse(source).path).name or 'weights'}"
    return None


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
    """The engine's command line for one replica.

    `weights` is what the engine loads: a GGUF file on the node for llama.cpp, a file or a
    repository id for vLLM. The port and context are always given, never left to the engine's
    defaults: newer llama-server builds changed both (8080 and the model's trained context).
    """
    port = port if port is not None else replica.port
    if port is None:
        raise ValueError(f"replica {replica.endpoint} of {model.name} has no port: it is not placed")
    exe = executable or DEFAULT_EXECUTABLES[profile.engine]
    if profile.engine == "llamacpp":
        argv = [
            exe,
            "--model",
            weights,
            "--host",
            host,
            "--port",
            str(port),
            "--ctx-size",
            str(profile.ctx_size),
            "--alias",
            profile.served_name,
        ]
        if (
            model.task == "embedding"
            and "--embeddings" not in profile.args
            and "--embedding" not in profile.args
        ):
            argv.append("--embeddings")
        return EngineCommand((*argv, *profile.args))
    argv = [
        exe,
        "serve",
        weights,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(model.context_length),
        "--served-model-name",
        profile.served_name,
    ]
    # Set even when empty: an engine given no GPUs must not grab every card on the node.
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in replica.gpu_ids)}
    return EngineCommand((*argv, *profile.args), env)
