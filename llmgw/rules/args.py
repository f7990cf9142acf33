"""args-owned, args-risky: what a profile's `args` may add to the engine's command line.

The args are appended after the flags llmgw writes itself (llmgw/engines.py), and both
engines take the last of a repeated flag: `args: [--host, 0.0.0.0, --port, "18555"]` once
passed lint and plan, and the engine listened on every interface, on a port the plan did
not know, where no key was asked for. What llmgw sets comes from the catalogue's own fields,
so a flag that sets it again is refused with the field to write instead. Flags that write or
serve files, or run code from the model's repository, are allowed but said, so the reviewer
of the pull request sees them in its comment.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.catalogue import Entry
from llmgw.findings import Finding
from llmgw.model import Profile
from llmgw.rules.context import Context

_ADDRESS = (
    "the address is the node's (fleet.yaml nodes[].address), where the gateway reaches the "
    "engine and asks for a key in front of it; remove it"
)
_PORT = (
    "the port is chosen from the node's range (fleet.yaml nodes[].ports) and written in the "
    "plan, the only port the gateway routes to; remove it"
)
_NAME = "clients reach the model by the model file's `name` and `aliases`; add the name there"
_MODEL = "the engine loads the model file's `source`; point source at these weights instead"
_LLAMACPP_CONTEXT = (
    "the context pool is the profile's `ctx_size` (context_length times --parallel when "
    "absent); set ctx_size instead"
)
_VLLM_CONTEXT = "the longest request is the model file's `context_length`; set it there instead"
_CONFIG = (
    "a file of further flags could set the address, port or name again where lint cannot "
    "see it; write the flags in args instead"
)

# Flag → why llmgw's own setting must stand. llama-server's short forms are its own
# (`-m`, `-c`, `-a`), and its --hf-* and --model-url flags load other weights than source.
OWNED: dict[str, dict[str, str]] = {
    "llamacpp": {
        "--host": _ADDRESS,
        "--port": _PORT,
        "--alias": _NAME,
        "-a": _NAME,
        "--model": _MODEL,
        "-m": _MODEL,
        "--model-url": _MODEL,
        "-mu": _MODEL,
        "--hf-repo": _MODEL,
        "-hf": _MODEL,
        "-hfr": _MODEL,
        "--hf-file": _MODEL,
        "-hff": _MODEL,
        "--ctx-size": _LLAMACPP_CONTEXT,
        "-c": _LLAMACPP_CONTEXT,
    },
    "vllm": {
        "--host": _ADDRESS,
        "--port": _PORT,
        "--uds": _ADDRESS,
        "--served-model-name": _NAME,
        "--model": _MODEL,
        "--max-model-len": _VLLM_CONTEXT,
        "--config": _CONFIG,
    },
}

# Flag → what it lets the engine do beyond answering requests.
RISKY: dict[str, dict[str, str]] = {
    "llamacpp": {
        "--log-file": "writes a file wherever it names on the node",
        "--path": "serves the files of a folder on the node over HTTP",
        "--slot-save-path": "writes the prompts' cache to files on the node",
        "--api-key-file": "reads a file on the node",
        "--rpc": "sends the weights to the servers it names",
    },
    "vllm": {
        "--trust-remote-code": "runs Python code from the model's repository on the node",
        "--download-dir": "writes the downloaded weights wherever it names on the node",
        "--allowed-local-media-path": "lets a request read files from a folder on the node",
        "--tool-parser-plugin": "imports a Python file on the node",
        "--middleware": "imports Python code into the server",
        "--worker-cls": "imports Python code into the workers",
        "--worker-extension-cls": "imports Python code into the workers",
        "--otlp-traces-endpoint": "sends traces of every request to the address it names",
    },
}


def check(ctx: Context) -> Iterator[Finding]:
    for entry, profile in ctx.placed_profiles():
        yield from _check_args(entry, profile)


def flag_of(arg: str, engine: str) -> str | None:
    """The flag an argument spells (`--port=1` and `--port` alike), or None for a value.

    vLLM's parser reads `--max_model_len` as `--max-model-len`, and argparse, unless told
    otherwise, takes an unambiguous prefix (`--max-model`) for the whole flag: both are read
    here as the flag they may stand for.
    """
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None  # a value, such as -1 for "no limit"
    name = arg.partition("=")[0]
    if engine != "vllm" or not name.startswith("--"):
        return name
    name = "--" + name[2:].replace("_", "-")
    known = [*OWNED["vllm"], *RISKY["vllm"]]
    if name in known:
        return name
    longer = [flag for flag in known if flag.startswith(name)]
    return longer[0] if len(name) > 3 and len(longer) == 1 else name


def _check_args(entry: Entry, profile: Profile) -> Iterator[Finding]:
    owned, risky = OWNED[profile.engine], RISKY[profile.engine]
    for i, arg in enumerate(profile.args):
        flag = flag_of(arg, profile.engine)
        if flag is None:
            continue
        path = (*entry.profile_path(profile), "args", i)
        if flag in owned:
            yield entry.doc.finding(
                "error",
                "args-owned",
                path,
                f"{arg} sets what llmgw sets itself for {profile.engine}: {owned[flag]}.",
            )
        elif flag in risky:
            yield entry.doc.finding(
                "warning",
                "args-risky",
                path,
                f"{arg} {risky[flag]}; keep it only if the node is meant to allow that, and "
                "the reviewer has read why.",
            )
