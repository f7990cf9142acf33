"""The fleet entry of the machine this runs on, from what the machine reports.

Fleet files used to be written from memory, and a node written down as 64 GB that had 32
is how a model gets placed where it cannot load. So each fact here is read, never
assumed: memory from the OS, GPUs from nvidia-smi, engines from PATH. Labels and the
address are the operator's to give, because no probe can know what the gateway reaches.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from llmgw.engines import executable_for, names
from llmgw.engines.base import GB
from llmgw.errors import UsageError
from llmgw.schema import validator

MIB = 1024 * 1024

Which = Callable[[str], str | None]
Run = Callable[[list[str]], str]


@dataclass
class Inventory:
    entry: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # what was not found, for stderr


def take_inventory(
    *,
    name: str | None = None,
    address: str | None = None,
    labels: Mapping[str, str] | None = None,
    ports: tuple[int, int] | None = None,
    meminfo: Path = Path("/proc/meminfo"),
    path: str | None = None,
    run: Run | None = None,
    environ: Mapping[str, str] | None = None,
) -> Inventory:
    """Read this machine's facts into one fleet node entry, checked against the fleet schema."""
    notes: list[str] = []

    def which(cmd: str) -> str | None:
        return shutil.which(cmd, path=path if path is not None else os.environ.get("PATH"))

    hostname = socket.gethostname().split(".")[0]
    entry: dict[str, Any] = {
        "name": name or _node_name(hostname),
        "address": address or socket.getfqdn(),
        "memory_gb": memory_gb(meminfo),
    }
    gpus = gpus_from_nvidia_smi(which, run or _run, notes)
    if gpus is not None:
        entry["gpus"] = gpus
    entry["labels"] = dict(sorted((labels or {}).items()))
    # Always written, even empty: this agent looked, so an empty list means none found,
    # where a missing key would mean an older agent that does not say.
    # By the agent's own rule (LLMGW_LLAMA_SERVER, PATH, the `local` extra's build), so the
    # entry says what the agent here would run.
    env = os.environ if environ is None else environ
    entry["engines"] = [e for e in names() if executable_for(e, path=path, environ=env)[0] is not None]
    if not entry["engines"]:
        notes.append(
            "no engine found (looked for llama-server and vllm on PATH, LLMGW_LLAMA_SERVER and "
            "LLMGW_VLLM, and the `local` extra's llama-server); install one or fix PATH before "
            "placing replicas here."
        )
    if ports is not None:
        entry["ports"] = {"first": ports[0], "last": ports[1]}
    if not address:
        notes.append(
            f"address {entry['address']} is this machine's own name for itself; pass --address "
            "with the one the gateway reaches it on, if that differs."
        )
    _check(entry)
    return Inventory(entry, notes)


def _node_name(hostname: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", hostname).strip("-._")[:63]
    return cleaned or "node"


def memory_gb(meminfo: Path = Path("/proc/meminfo")) -> float:
    """Total memory in GB, rounded down: overstating it is what places a model that won't fit."""
    total_bytes = _meminfo_total(meminfo)
    if total_bytes is None:
        try:
            total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            raise UsageError(
                "cannot read this machine's memory (no /proc/meminfo, no sysconf); "
                "write memory_gb into the fleet file by hand."
            ) from None
    return _floor_tenth(total_bytes / GB)


def _meminfo_total(meminfo: Path) -> int | None:
    try:
        text = meminfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def gpus_from_nvidia_smi(which: Which, run: Run, notes: list[str]) -> dict[str, Any] | None:
    """{count, memory_gb} from nvidia-smi; None when it is absent or cannot answer."""
    exe = which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"])
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi is installed but failed ({exc}); GPUs left out of the entry.")
        return None
    sizes_mib = [float(x) for x in re.findall(r"^\s*(\d+(?:\.\d+)?)\s*$", out, re.MULTILINE)]
    if not sizes_mib:
        notes.append("nvidia-smi reported no GPUs; GPUs left out of the entry.")
        return None
    # The fleet has one size per node; with mixed cards the smallest is the one every
    # replica can count on.
    if len(set(sizes_mib)) > 1:
        notes.append("GPUs of different sizes: memory_gb is the smallest of them.")
    return {"count": len(sizes_mib), "memory_gb": _floor_tenth(min(sizes_mib) * MIB / GB)}


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def _floor_tenth(x: float) -> float:
    value = math.floor(x * 10) / 10
    return int(value) if value.is_integer() else value


def _check(entry: dict[str, Any]) -> None:
    node_schema = validator("fleet").schema["properties"]["nodes"]["items"]
    errors = sorted(
        validator("fleet").evolve(schema=node_schema).iter_errors(entry),
        key=lambda e: list(e.absolute_path),
    )
    if errors:
        at = "/".join(str(p) for p in errors[0].absolute_path) or "the entry"
        raise UsageError(f"the inventory would not be a valid fleet node ({at}: {errors[0].message}).")


def parse_labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {pair!r} is not KEY=VALUE (for example --label pool=gpu).")
        labels[key] = value
    return labels


def parse_ports(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not match or not (1 <= int(match.group(1)) <= int(match.group(2)) <= 65535):
        raise UsageError(f"--ports {text!r} is not FIRST-LAST within 1-65535 (for example 8001-8099).")
    return int(match.group(1)), int(match.group(2))


_PLAIN = re.compile(r"[A-Za-z0-9._/-]+")


def _quoted(text: str) -> str:
    return text if _PLAIN.fullmatch(text) else DoubleQuotedScalarString(text)


def entry_yaml(entry: dict[str, Any]) -> str:
    """The entry as a `nodes:` list item, indented to paste under `nodes:` in fleet.yaml."""
    yaml = YAML()
    yaml.default_flow_style = None  # leaves in flow style: labels: {pool: gpu}, like fleet.yaml
    yaml.indent(mapping=2, sequence=2, offset=0)
    out = StringIO()
    # ruamel writes `zone: rack:3` plain inside { }, which YAML parsers (ruamel's own
    # included) refuse: quote every label value that is not a plain word.
    labels = {_quoted(k): _quoted(v) for k, v in entry.get("labels", {}).items()}
    yaml.dump([{**entry, "labels": labels} if "labels" in entry else entry], out)
    return "".join(f"  {line}\n" if line else "\n" for line in out.getvalue().splitlines())


# Kubernetes: the fleet is what `kubectl get nodes -o json` says the scheduler may use.

KUBECTL_HEADER = (
    "# yaml-language-server: $schema=schema/fleet.schema.json\n"
    "# Written by `llmgw inventory --kubernetes` from `kubectl get nodes -o json`: allocatable\n"
    "# memory and GPUs, which is what the scheduler hands out. Plan with --target kubernetes.\n"
)
_QUANTITY = re.compile(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)([KMGTPE]i?|k|m)?")
_FACTORS = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per card, from NVIDIA's GPU feature discovery
# Taints the engine pods `llmgw render kubernetes` writes tolerate.
TOLERATED_TAINTS = frozenset({GPU_RESOURCE})


def quantity(text: str) -> float:
    """A Kubernetes quantity ("64Gi", "65842948Ki", "1e9") as a plain number."""
    match = _QUANTITY.fullmatch(str(text).strip())
    if not match:
        raise UsageError(f"{text!r} is not a Kubernetes quantity (such as 64Gi); is this kubectl's output?")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def fleet_from_kubectl(doc: Any) -> Inventory:
    """Fleet entries from `kubectl get nodes -o json`: {"nodes": [...]} and notes on what was
    left out. A node the scheduler will not use (cordoned, not ready, tainted) is left out,
    since a plan counted on it would promise room that is not there."""
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise UsageError(
            "this is not the output of `kubectl get nodes -o json` (no items list); run that "
            "command and give its output to --kubernetes."
        )
    entries: list[dict[str, Any]] = []
    notes: list[str] = []
    for item in sorted(items, key=lambda i: str(i.get("metadata", {}).get("name", ""))):
        entry = _kubectl_node(item, notes)
        if entry is not None:
            _check(entry)
            entries.append(entry)
    if not entries:
        notes.append("no node is schedulable: the fleet is empty, and nothing can be planned onto it.")
    return Inventory({"nodes": entries}, notes)


def _kubectl_node(item: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
    name = str(meta.get("name", ""))
    why_not = _unschedulable(spec, status)
    if why_not:
        notes.append(f"node {name} is left out: {why_not}.")
        return None
    allocatable = status.get("allocatable", {})
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses", [])}
    entry: dict[str, Any] = {
        "name": _node_name(name),
        # The scheduler places pods, so nothing is sent to this address; it names the node.
        "address": addresses.get("InternalIP") or addresses.get("Hostname") or name,
        "memory_gb": _floor_tenth(quantity(allocatable.get("memory", "0")) / GB),
    }
    count = int(quantity(allocatable.get(GPU_RESOURCE, "0")))
    if count:
        mib = labels.get(GPU_MEMORY_LABEL, "")
        if not mib.isdigit():
            notes.append(
                f"node {name} has {count} GPU(s) but no {GPU_MEMORY_LABEL} label, so their memory is "
                "written as 0 and no GPU model fits there: run NVIDIA's GPU feature discovery, or write "
                "gpus.memory_gb by hand."
            )
        each_gb = _floor_tenth(int(mib) * MIB / GB) if mib.isdigit() else 0
        entry["gpus"] = {"count": count, "memory_gb": each_gb}
    entry["labels"] = dict(sorted(labels.items()))
    return entry


def _unschedulable(spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    if spec.get("unschedulable"):
        return "it is cordoned (spec.unschedulable)"
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        return f"it is not Ready ({ready.get('reason') or ready.get('status')})"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") not in TOLERATED_TAINTS:
            return f"its taint {taint.get('key')}:{taint.get('effect')} keeps the engines' pods off it"
    return None


def fleet_yaml(fleet: dict[str, Any]) -> str:
    """A whole fleet file; labels one a line, since a cluster's nodes carry dozens."""
    yaml = YAML()
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = StringIO()
    nodes = [
        {**e, "labels": {_quoted(k): _quoted(v) for k, v in e["labels"].items()}} for e in fleet["nodes"]
    ]
    yaml.dump({"nodes": nodes}, out)
    return KUBECTL_HEADER + out.getvalue()
