"""vLLM: safetensors or a hub repository it fetches itself, on GPUs.

    vllm serve SOURCE --host ADDRESS --port PORT --max-model-len CONTEXT
               --served-model-name SERVED_NAME ARGS...
    with CUDA_VISIBLE_DEVICES set to the replica's GPUs

Slots: `--max-num-seqs N` in the profile's args, else vLLM's 256; it pages one cache among
them, so every request may use context_length. Memory: the rough rule (llmgw.compiler.memory).
"""

from __future__ import annotations

from llmgw.engines.base import (
    OWNED_ADDRESS,
    OWNED_KEY,
    OWNED_MODEL,
    OWNED_NAME,
    OWNED_PORT,
    Engine,
    EngineCommand,
    count_in,
)
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

_CONTEXT = "the longest request is the model file's `context_length`; set it there instead"
_CONFIG = (
    "a file of further flags could set the address, port or name again where lint cannot "
    "see it; write the flags in args instead"
)
DEFAULT_SLOTS = 256


class Vllm(Engine):
    name = "vllm"
    program = "vllm"
    environ_key = "LLMGW_VLLM"
    install_hint = "vllm is not installed on this node: `pip install vllm`, or set LLMGW_VLLM to its path."
    reads = frozenset({"safetensors", "bin", "repository"})
    needs_gpu = True
    image = "docker.io/vllm/vllm-openai:v0.6.6"
    image_program = "vllm"
    owned_flags = {
        "--host": OWNED_ADDRESS,
        "--port": OWNED_PORT,
        "--uds": OWNED_ADDRESS,
        "--served-model-name": OWNED_NAME,
        "--model": OWNED_MODEL,
        "--max-model-len": _CONTEXT,
        "--config": _CONFIG,
        "--api-key": OWNED_KEY,
    }
    risky_flags = {
        "--trust-remote-code": "runs Python code from the model's repository on the node",
        "--download-dir": "writes the downloaded weights wherever it names on the node",
        "--allowed-local-media-path": "lets a request read files from a folder on the node",
        "--tool-parser-plugin": "imports a Python file on the node",
        "--middleware": "imports Python code into the server",
        "--worker-cls": "imports Python code into the workers",
        "--worker-extension-cls": "imports Python code into the workers",
        "--otlp-traces-endpoint": "sends traces of every request to the address it names",
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
        argv = (
            *(exe, "serve", weights, "--host", host, "--port", str(port)),
            *("--max-model-len", str(model.context_length), "--served-model-name", profile.served_name),
        )
        # Set even when empty: an engine given no GPUs must not grab every card on the node.
        return EngineCommand(argv, {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in replica.gpu_ids)})

    def with_credential(self, command: EngineCommand, key_file: str, key: str) -> EngineCommand:
        # vLLM takes no key file: its environment, which only the agent's user can read.
        return EngineCommand(command.argv, {**command.env, "VLLM_API_KEY": key})

    def slots(self, args: tuple[str, ...]) -> int:
        return count_in(args, "--max-num-seqs", "--max_num_seqs") or DEFAULT_SLOTS

    def flag_of(self, arg: str) -> str | None:
        """vLLM's parser reads `--max_model_len` as `--max-model-len`, and argparse, unless
        told otherwise, takes an unambiguous prefix (`--max-model`) for the whole flag: both
        are read here as the flag they may stand for."""
        name = super().flag_of(arg)
        if name is None or not name.startswith("--"):
            return name
        name = "--" + name[2:].replace("_", "-")
        known = [*self.owned_flags, *self.risky_flags]
        if name in known:
            return name
        longer = [flag for flag in known if flag.startswith(name)]
        return longer[0] if len(name) > 3 and len(longer) == 1 else name


ENGINE = Vllm()
