"""The compiler's front half: catalogue directory + fleet → findings and placed models.

    load (YAML, positions on demand) → validate (JSON Schema) → model (typed)
      → rules (one family a module) → place (replicas → nodes)

Every finding in one run: a file that fails to parse or validate drops out of
the later stages, and every other file goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.catalogue import Entry
from llmgw.errors import FleetError, UsageError
from llmgw.findings import Finding, count
from llmgw.load import Document, load_document
from llmgw.model import Fleet, ModelSpec, Node
from llmgw.place import Placement, place
from llmgw.plan import Plan, cycle_collector_paused, file_sha256
from llmgw.rules import demand, run_rules
from llmgw.rules.context import Context
from llmgw.validate import check_document, schema_findings

MODEL_SUFFIXES = (".yaml", ".yml")


@dataclass
class LintResult:
    catalog: str
    fleet: Fleet
    fleet_doc: Document
    entries: list[Entry]  # models that passed the schema, sorted by name
    documents: list[Document]  # every model file that parsed, in path order
    findings: list[Finding]
    placement: Placement
    files_checked: int

    def counts(self) -> tuple[int, int]:
        return count(self.findings)

    def warnings_for(self, file: str) -> list[Finding]:
        return [f for f in self.findings if f.file == file and f.severity == "warning"]


def lint(
    catalog: Path, fleet_path: Path, previous: Plan | None = None, *, kubernetes: bool = False
) -> LintResult:
    """`kubernetes`: the plan is for --target kubernetes, which refuses what it cannot run."""
    with cycle_collector_paused():
        return _lint(catalog, fleet_path, previous, kubernetes)


def _lint(catalog: Path, fleet_path: Path, previous: Plan | None, kubernetes: bool) -> LintResult:
    files = catalogue_files(catalog)
    fleet, fleet_doc = read_fleet(fleet_path)
    findings: list[Finding] = []
    documents: list[Document] = []
    entries: list[Entry] = []
    inside = catalog.resolve()
    folders: dict[Path, bool] = {}
    for path in files:
        display = path.as_posix()
        if not _reads_inside(path, inside, folders):
            # Findings quote what they read, and lint's output is posted on pull
            # requests: a link to /etc/shadow must not be read at all.
            findings.append(
                Finding(
                    display,
                    1,
                    1,
                    "yaml",
                    "error",
                    f"this is a symlink to a file outside {catalog.as_posix()}/, "
                    "which lint does not read; put the model file itself here.",
                )
            )
            continue
        doc, problems = load_document(path, display)
        findings.extend(problems)
        if doc is None or problems:
            continue
        documents.append(doc)
        problems, data = check_document(doc, "model")
        findings.extend(problems)
        if data is None:
            continue  # a required key is missing or wrong: nothing sound to check further
        entries.append(Entry(doc, ModelSpec.model_validate(data), path.parent, catalog))
    entries.sort(key=lambda e: e.spec.name)
    changed = changed_since(previous, documents)
    findings.extend(run_rules(Context(entries, fleet, changed)))
    if kubernetes:
        findings.extend(demand.unsupported_on_kubernetes(entries))
    placement = place(entries, fleet, previous, changed)
    findings.extend(placement.findings)
    findings.extend(demand.crowded(entries, placement))
    findings.sort()
    return LintResult(
        catalog.as_posix(), fleet, fleet_doc, entries, documents, findings, placement, len(files)
    )


def _reads_inside(path: Path, inside: Path, folders: dict[Path, bool]) -> bool:
    """True when `path` resolves to a file under `inside`. A file that is no symlink is
    where its folder is, and each folder is resolved once: resolving every one of 5,000
    paths, a system call per part, took a tenth of a lint."""
    if path.is_symlink():
        return path.resolve().is_relative_to(inside)
    folder = path.parent
    if folder not in folders:
        folders[folder] = folder.resolve().is_relative_to(inside)
    return folders[folder]


def changed_since(previous: Plan | None, documents: list[Document]) -> frozenset[str] | None:
    """The model files new or edited since `previous` was planned; None without a plan.

    A clash or a shortage is reported on these, so a pull request's findings land on the
    files it touched (the plan's inputs record each file's path and sha256).
    """
    if previous is None:
        return None
    before = {f.path: f.sha256 for f in previous.inputs.files}
    return frozenset(d.file for d in documents if before.get(d.file) != file_sha256(d.text))


def catalogue_files(catalog: Path) -> list[Path]:
    if not catalog.is_dir():
        what = "is a file" if catalog.exists() else "does not exist"
        raise UsageError(
            f"catalogue directory {catalog} {what}; give the folder that holds one YAML file "
            "per model (default: catalog/)."
        )
    # Sorted, so findings and the plan do not depend on the order files sit on disk.
    depth = len(catalog.parts)  # rglob's paths start with the catalogue's own parts
    return sorted(
        p
        for p in catalog.rglob("*")
        if p.suffix in MODEL_SUFFIXES
        and not any(part.startswith(".") for part in p.parts[depth:])
        and p.is_file()
    )


def read_fleet(path: Path) -> tuple[Fleet, Document]:
    """The fleet must be right before anything can be checked against it: mistakes exit 2."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        message = (
            f"fleet inventory {path} {what}; write one (see `llmgw inventory` on each "
            "node) or pass --fleet PATH."
        )
        raise FleetError(message, [Finding(path.as_posix(), 1, 1, "fleet", "error", message)])
    doc, problems = load_document(path, path.as_posix())
    if doc is not None and not problems:
        problems = schema_findings(doc, "fleet")
    if doc is None or problems:
        raise FleetError(_fleet_problems(path, problems), problems)
    fleet = Fleet.model_validate({**doc.data, "file": path.as_posix()})
    problems = _fleet_consistency(fleet, doc)
    if problems:
        raise FleetError(_fleet_problems(path, problems), problems)
    return fleet, doc


def _fleet_consistency(fleet: Fleet, doc: Document) -> list[Finding]:
    problems = []
    seen: dict[str, int] = {}
    # Earlier nodes by address: comparing each node with every earlier one took minutes
    # at 10,000 nodes, and only nodes sharing an address can clash.
    at: dict[str, list[tuple[int, Node]]] = {}
    for i, node in enumerate(fleet.nodes):
        earlier = at.setdefault(node.address, [])
        for j, other in earlier:
            if _ranges_overlap(other, node):
                # Two replicas would get one host:port, and the gateway would route both to one.
                problems.append(
                    doc.finding(
                        "error",
                        "schema",
                        ("nodes", i, "address"),
                        f"node '{node.name}' has the address {node.address} of node '{other.name}' "
                        f"(node {j + 1}) with overlapping ports; give each node its own address, "
                        "or disjoint port ranges.",
                    )
                )
        if node.name in seen:
            problems.append(
                doc.finding(
                    "error",
                    "schema",
                    ("nodes", i, "name"),
                    f"node name '{node.name}' is used twice (also node {seen[node.name] + 1}); "
                    "give each node its own name.",
                )
            )
        seen.setdefault(node.name, i)
        earlier.append((i, node))
        if node.ports.first > node.ports.last:
            problems.append(
                doc.finding(
                    "error",
                    "schema",
                    ("nodes", i, "ports"),
                    f"ports.first {node.ports.first} is after ports.last {node.ports.last}; swap them.",
                )
            )
    return problems


def _ranges_overlap(a: Node, b: Node) -> bool:
    return a.ports.first <= b.ports.last and b.ports.first <= a.ports.last


def _fleet_problems(path: Path, problems: list[Finding]) -> str:
    lines = [f"{f.file}:{f.line}:{f.column}: {f.severity}[{f.rule}] {f.message}" for f in problems]
    return f"cannot use the fleet inventory {path}; fix it first:\n  " + "\n  ".join(lines)
