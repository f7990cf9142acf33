"""The compiler's front half: catalogue directory + fleet → findings and placed models.

    load (YAML, positions on demand) → validate (JSON Schema) → model (typed)
      → rules (one family a module) → place (replicas → nodes)

Every finding in one run: a file that fails to parse or validate drops out of
the later stages, and every other file goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.compiler.catalogue import Entry, catalogue_files
from llmgw.compiler.keys import lint_keys
from llmgw.compiler.place import Placement, place
from llmgw.compiler.rules import on_demand, run_rules
from llmgw.compiler.rules.context import Context
from llmgw.compiler.rules.fleet import fleet_problems
from llmgw.compiler.validate import check_document, schema_findings
from llmgw.errors import FleetError, UsageError
from llmgw.findings import Finding, count
from llmgw.load import Document, load_document
from llmgw.model import Fleet, ModelSpec
from llmgw.plan import Plan, cycle_collector_paused, file_sha256


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
    catalog: Path,
    fleet_path: Path,
    previous: Plan | None = None,
    *,
    kubernetes: bool = False,
    keys: Path | None = None,
) -> LintResult:
    """Every finding of one run. `kubernetes`: the plan is for --target kubernetes, which
    refuses what it cannot run. `keys`: the keys file, checked against the catalogue, so a
    keys file lint fails also stops the plan (plan once passed it, though it "runs lint")."""
    with cycle_collector_paused():
        return _lint(catalog, fleet_path, previous, kubernetes, keys)


def _lint(
    catalog: Path, fleet_path: Path, previous: Plan | None, kubernetes: bool, keys: Path | None
) -> LintResult:
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
    findings.extend(run_rules(Context(entries, fleet, changed, kubernetes=kubernetes)))
    placement = place(entries, fleet, previous, changed)
    findings.extend(placement.findings)
    findings.extend(on_demand.crowded(entries, placement))
    if keys is not None:
        if not keys.is_file():
            raise UsageError(
                f"--keys {keys} does not exist; give the keys.yaml to check, or leave --keys out."
            )
        findings.extend(lint_keys(keys, entries, previous=previous))
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
    problems = fleet_problems(fleet, doc)
    if problems:
        raise FleetError(_fleet_problems(path, problems), problems)
    return fleet, doc


def _fleet_problems(path: Path, problems: list[Finding]) -> str:
    lines = [f"{f.file}:{f.line}:{f.column}: {f.severity}[{f.rule}] {f.message}" for f in problems]
    return f"cannot use the fleet inventory {path}; fix it first:\n  " + "\n  ".join(lines)
