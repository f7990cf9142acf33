"""The plan every reader uses: its types, and reading, checking, digesting and writing it.

The compiler builds it (llmgw/compiler/build.py); the gateway, the node agent and the renderers
read it here, and nothing here imports the compiler.

A plan is a promise: it lists only replicas that were placed, with every default
filled in, so that nothing downstream has to know the catalogue's rules.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from llmgw import __version__
from llmgw.errors import PlanError
from llmgw.schema import proves_valid, validator

FORMAT_VERSION: Literal["1"] = "1"


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a stage builds its many small objects.

    Catalogue documents, typed models, findings and plans hold no reference cycles, yet
    the collector walked every live object again and again as they were built: a third
    of linting and planning 5,000 models. It runs as usual once the stage is done.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def plan_digest(plan: dict[str, Any]) -> str:
    """sha256 of the plan's canonical JSON without its own digest key, nor the digest of the
    plan it was made over (inputs.previous): reverting a file once gave a new digest though no
    engine changed, which read as a change. The digest moves only when what is served does."""
    body = {k: v for k, v in plan.items() if k != "digest"}
    inputs = body.get("inputs")
    if isinstance(inputs, dict) and "previous" in inputs:
        body["inputs"] = {k: v for k, v in inputs.items() if k != "previous"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def _earlier_digest(plan: dict[str, Any]) -> str:
    """The digest as plans written before it left out inputs.previous have it."""
    body = {k: v for k, v in plan.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def file_sha256(text: str) -> str:
    """How a plan's inputs record each file, so the next run can tell what changed since."""
    return hashlib.sha256(text.encode()).hexdigest()


def dump_plan(plan: dict[str, Any]) -> str:
    # Keys keep the order build_plan gave them, so a diff of two plans reads
    # top-down like the catalogue; the digest does not depend on that order.
    try:
        return _indented(plan, "") + "\n"
    except TypeError:  # a value _indented does not know: json says what it makes of it
        return json.dumps(plan, indent=2, ensure_ascii=False) + "\n"


_quoted = json.encoder.encode_basestring  # what json.dumps uses with ensure_ascii=False
_INFINITY = float("inf")


def _indented(value: Any, pad: str) -> str:
    """The text `json.dumps(value, indent=2, ensure_ascii=False)` writes, byte for byte.

    json indents in pure Python, a generator per container: half a second of writing a
    5,000-model plan. Building each container's text in one join takes half that.
    TypeError for any value json would need to convert (a tuple, an int subclass, a key
    that is not a string), so the caller can leave it to json.
    """
    kind = type(value)
    if kind is str:
        return _quoted(value)
    if kind is dict:
        if not value:
            return "{}"
        inner = pad + "  "
        items = []
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(key)
            items.append(_quoted(key) + ": " + _indented(item, inner))
        return "{\n" + inner + (",\n" + inner).join(items) + "\n" + pad + "}"
    if kind is list:
        if not value:
            return "[]"
        inner = pad + "  "
        return "[\n" + inner + (",\n" + inner).join([_indented(v, inner) for v in value]) + "\n" + pad + "]"
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if kind is float:
        if value != value:
            return "NaN"
        if value in (_INFINITY, -_INFINITY):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    raise TypeError(value)


def check_plan(doc: Any, where: str = "the plan") -> dict[str, Any]:
    """Return `doc` when it is a valid plan whose digest matches; else PlanError, a sentence."""
    if not isinstance(doc, dict):
        raise PlanError(f"{where} is not a JSON object; write it with `llmgw plan`.")
    # A plan `llmgw plan` wrote is proved valid in a fraction of the seconds jsonschema
    # takes over a 5,000-model plan, which the gateway reads as it starts.
    valid = proves_valid("plan")(doc)
    errors = [] if valid else sorted(validator("plan").iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        at = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise PlanError(
            f"{where} does not match schema/plan.schema.json at {at}: {first.message}{more}. "
            "Write plans with `llmgw plan` rather than by hand."
        )
    expected = plan_digest(doc)
    # A plan an earlier llmgw wrote (its digest covering inputs.previous) is read as it was.
    if doc["digest"] != expected and doc["digest"] != _earlier_digest(doc):
        raise PlanError(
            f"{where} says its digest is {doc['digest']} but its content hashes to {expected}: "
            "it was edited after `llmgw plan` wrote it. Run `llmgw plan` again instead of editing it."
        )
    return doc


def parse_plan(text: str | bytes, where: str = "the plan") -> Plan:
    """Check and type a plan's text; PlanError says what is wrong with it."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{where} is not valid JSON ({exc}); write it with `llmgw plan`.") from None
    except RecursionError:
        # A deployed body is anyone's bytes: `[[[...` nested deeper than Python recurses
        # escaped as a 500 with a traceback in the log.
        raise PlanError(
            f"{where} nests arrays or objects deeper than any plan does; write it with `llmgw plan`."
        ) from None
    try:
        return Plan.of(check_plan(doc, where))
    except UnicodeEncodeError:
        # JSON may spell a lone surrogate (`"\ud800"`), which no UTF-8 file can hold: the
        # digest, and the plan file itself, could not be written.
        raise PlanError(
            f"{where} holds a lone UTF-16 surrogate (an escape like \\ud800 without its pair), "
            "which is not text; write it with `llmgw plan`."
        ) from None
    except ValidationError as exc:
        # The schema reads `1e308` as a whole number, and the typed plan cannot hold it:
        # a deployed body like that escaped as a 500, and at a worker's start as a failed boot.
        first = exc.errors()[0]
        at = "/".join(str(p) for p in first["loc"]) or "(top level)"
        raise PlanError(
            f"{where} passes its schema but not the plan's types at {at}: {first['msg']}. "
            "Write plans with `llmgw plan` rather than by hand."
        ) from None
    except RecursionError:
        raise PlanError(
            f"{where} nests arrays or objects deeper than any plan does; write it with `llmgw plan`."
        ) from None


def read_plan(path: Path | str) -> Plan:
    """Read, check and type a plan file; PlanError says what is wrong with it."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read plan {path}: {exc.strerror or exc}.") from None
    return parse_plan(text, where=str(path))


def read_previous(path: Path | str) -> Plan | None:
    """Read a plan given as --previous; an empty file (such as /dev/null) stands for none.

    The first deploy has no deployed plan and the first pull request no base plan: both
    mean "nothing placed yet", the same rule as the old side of `llmgw diff`.
    """
    p = Path(path)
    try:
        st = p.stat()
        # Not any file of size 0: a pipe (`--previous <(curl …)`) has none and holds a plan.
        empty = (stat.S_ISREG(st.st_mode) and st.st_size == 0) or os.path.samefile(p, os.devnull)
    except OSError:
        empty = False  # read_plan says why the file cannot be read
    return None if empty else read_plan(p)


# The plan as typed objects, for every reader that is not the compiler. The JSON Schema stays
# the published contract (editors and other tools read it); a test keeps the two in step, field
# for field. Numbers are `int | float` so that a plan read and written back keeps its bytes.
Number = int | float


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileRef(_Part):
    path: str
    sha256: str


class GeneratedBy(_Part):
    tool: Literal["llmgw"]
    version: str


class Inputs(_Part):
    catalog: str
    fleet: FileRef
    files: tuple[FileRef, ...]
    previous: str | None = None


class PortRange(_Part):
    first: int
    last: int


class NodeUse(_Part):
    memory_gb: Number
    gpus: int
    replicas: int


class OnDemandUse(_Part):
    """A node's on-demand replicas: each fits beside its always-on ones; together they may not."""

    replicas: int
    memory_gb: Number  # what they would take if all ran at once
    largest_gb: Number


class PlanNode(_Part):
    name: str
    address: str
    memory_gb: Number
    gpus: int
    gpu_memory_gb: Number
    labels: dict[str, str]
    engines: tuple[str, ...] | None = None  # None: the node reports nothing, which is not "none"
    ports: PortRange
    used: NodeUse  # the always-on replicas
    on_demand: OnDemandUse | None = None  # None: the node has no on-demand replica
    agent: str | None = None  # where its agent listens; written when it has on-demand replicas


class PlanMemory(_Part):
    gb: Number
    source: Literal["declared", "estimated"]
    basis: str


class PlanReplica(_Part):
    endpoint: str
    node: str | None = None  # None: an external endpoint, or a workload the cluster schedules
    port: int | None = None
    gpu_ids: tuple[int, ...] = ()
    # "dns": the endpoint's host lists every instance; the gateway routes to each address.
    discovery: Literal["dns"] | None = None


class Workload(_Part):
    name: str
    replicas: int


class Target(_Part):
    kind: Literal["kubernetes"]
    namespace: str
    cluster_domain: str
    port: int


class PlanProfile(_Part):
    name: str
    engine: str  # one of llmgw.engines.names(), as the plan schema lists them
    priority: int
    weight: int
    ctx_size: int
    args: tuple[str, ...]
    gpus: int
    node_selector: dict[str, str]
    memory: PlanMemory | None = None
    served_name: str
    routing: Literal["prefix", "least-loaded"] | None = None  # None: a plan from before routing
    external: bool
    # None: always on. "on-demand": the node agent starts a replica when the gateway asks,
    # and stops it after idle_stop_s without requests.
    start: Literal["on-demand"] | None = None
    idle_stop_s: int | None = None
    workload: Workload | None = None  # a Kubernetes workload; None for the node agents
    replicas: tuple[PlanReplica, ...]

    @property
    def on_demand(self) -> bool:
        return self.start == "on-demand"


class PlanWarning(_Part):
    rule: str
    message: str


class PlanModel(_Part):
    name: str
    description: str | None = None  # None: undescribed, and the JSON has no key at all
    aliases: tuple[str, ...]
    task: Literal["chat", "completion", "embedding", "rerank"]
    source: str
    format: Literal["gguf", "safetensors", "bin", "repository", "unknown"]
    weights_bytes: int | None = None
    context_length: int
    max_output: int | None = None
    replicas: int
    file: str
    profiles: tuple[PlanProfile, ...]
    warnings: tuple[PlanWarning, ...]
    fallbacks: tuple[str, ...] = ()  # (): none, and the JSON has no key, as before fallbacks


class Plan(_Part):
    format_version: Literal["1"]
    digest: str
    generated_by: GeneratedBy
    inputs: Inputs
    target: Target | None = None  # None: the node agents run what the plan places
    nodes: tuple[PlanNode, ...]
    models: tuple[PlanModel, ...]
    _doc: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Plan:
        """The typed view of a checked plan document (see `check_plan`)."""
        plan = cls.model_validate(doc)
        plan._doc = doc
        return plan

    @property
    def doc(self) -> dict[str, Any]:
        """The document as written, for writing it on unchanged (its bytes and digest)."""
        return self._doc

    def document(self) -> dict[str, Any]:
        """The document these objects stand for, keyed as `llmgw plan` writes it.

        Every field with a default is one the compiler leaves out when it does not apply (no
        description, a CPU replica's gpu_ids), so a default is written as no key at all.
        """
        return self.model_dump(mode="json", exclude_defaults=True)

    def node(self, name: str) -> PlanNode | None:
        return next((n for n in self.nodes if n.name == name), None)


def assemble_plan(
    models: Iterable[PlanModel],
    nodes: Iterable[PlanNode] = (),
    *,
    inputs: Inputs,
    target: Target | None = None,
) -> Plan:
    """A checked plan made of typed parts, in the order given, its digest filled in as
    `build_plan` fills it.

    For a plan that placement cannot produce, such as a test's engine listening on a port the
    OS picked: built from the same types every reader gets, a renamed field fails the type
    check here rather than a reader at run time, and the schema check refuses anything that
    `llmgw plan` could not have written.
    """
    draft = Plan(
        format_version=FORMAT_VERSION,
        digest="",
        generated_by=GeneratedBy(tool="llmgw", version=__version__),
        inputs=inputs,
        target=target,
        nodes=tuple(nodes),
        models=tuple(models),
    )
    doc = draft.document()
    doc["digest"] = plan_digest(doc)
    return Plan.of(check_plan(doc))
