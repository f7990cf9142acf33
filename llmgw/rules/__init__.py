"""Lint rules: each family is a module whose `check(ctx)` yields findings.

Every rule sees only models that passed the schema, so it can trust types and
defaults; a rule never prints and never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.errors import InspectError
from llmgw.findings import Finding
from llmgw.load import Document
from llmgw.memory import Memory, memory_for
from llmgw.model import Architecture, Fleet, ModelSpec, Profile
from llmgw.source import Source, classify_source, local_weights_bytes

if TYPE_CHECKING:
    from llmgw.header import Header


@dataclass
class Entry:
    """One valid model file: the document (for positions) and what it says."""

    doc: Document
    spec: ModelSpec
    base_dir: Path
    catalogue: Path | None = None  # a source is not followed out of it through a symlink

    @cached_property
    def source(self) -> Source:
        return classify_source(self.spec.source, self.base_dir, self.catalogue)

    @cached_property
    def weights_bytes(self) -> int | None:
        return self.spec.weights_bytes or local_weights_bytes(self.source)

    @cached_property
    def header(self) -> Header | InspectError | None:
        """A local GGUF's header, when the model file has no architecture written.

        Lint stays offline and depends only on what is on disk: a remote source is never
        fetched here, and a header that cannot be read is an answer (the error), not a crash.
        """
        src = self.source
        if self.spec.architecture is not None or src.format != "gguf" or src.local is None:
            return None
        if not src.local.is_file():
            return None
        from llmgw.inspect import inspect

        try:
            return inspect(src.text, base_dir=self.base_dir).header
        except InspectError as exc:
            return exc

    @cached_property
    def architecture(self) -> tuple[Architecture | None, str]:
        """The architecture the estimate uses, and where it came from."""
        if self.spec.architecture is not None:
            return self.spec.architecture, "the model file"
        header = self.header
        if header is None or isinstance(header, InspectError):
            return None, "nowhere"
        from llmgw.inspect import architecture_block

        block = architecture_block(header)
        if block is None:
            return None, "nowhere"
        return Architecture.model_validate(block), "the GGUF header"

    def memory(self, profile: Profile) -> Memory | None:
        arch, where = self.architecture
        return memory_for(self.spec, profile, self.weights_bytes, arch, where)

    def profile_path(self, profile: Profile) -> tuple[str | int, ...]:
        return ("profiles", self.spec.profiles.index(profile))


@dataclass
class Context:
    entries: list[Entry]
    fleet: Fleet
    # Files new or edited since the previous plan (by path and sha256); None without one.
    changed: frozenset[str] | None = None
    _answers: dict[Hashable, object] = field(default_factory=dict)

    def is_new(self, entry: Entry) -> bool:
        """True when `entry`'s file is new or edited since the previous plan, or there is none."""
        return self.changed is None or entry.doc.file in self.changed

    def to_blame(self, entries: list[Entry]) -> list[Entry]:
        """Of the files in a clash, those to report it on: the ones a pull request added or
        edited, since a reviewer sent to an untouched file looks for a mistake that is not
        there. All of them without a previous plan, or when none is new (a stale plan)."""
        new = [e for e in entries if self.is_new(e)]
        return new or entries

    def placed_profiles(self) -> Iterator[tuple[Entry, Profile]]:
        """Profiles the fleet must run: every one without endpoints of its own."""
        for entry in self.entries:
            for profile in entry.spec.profiles:
                if not profile.external:
                    yield entry, profile

    def once(self, key: Hashable, compute: Callable[..., object], *args: object) -> object:
        """Thousands of profiles share a handful of selectors: answer each question once."""
        if key not in self._answers:
            self._answers[key] = compute(*args)
        return self._answers[key]


Rule = Callable[[Context], Iterable[Finding]]


def all_rules() -> list[Rule]:
    from llmgw.rules import args, demand, external, fleet, limits, memory, names, sources

    return [
        names.check,
        sources.check,
        args.check,
        limits.check,
        fleet.check,
        memory.check,
        external.check,
        demand.check,
    ]


def run_rules(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule(ctx))
    return findings
