"""Lint rules: each family is a module whose `check(ctx)` yields findings.

Every rule sees only models that passed the schema, so it can trust types and
defaults; a rule never prints and never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from llmgw.findings import Finding
from llmgw.load import Document
from llmgw.memory import Memory, memory_for
from llmgw.model import Fleet, ModelSpec, Profile
from llmgw.source import Source, classify_source, local_weights_bytes


@dataclass
class Entry:
    """One valid model file: the document (for positions) and what it says."""

    doc: Document
    spec: ModelSpec
    base_dir: Path

    @cached_property
    def source(self) -> Source:
        return classify_source(self.spec.source, self.base_dir)

    @cached_property
    def weights_bytes(self) -> int | None:
        return self.spec.weights_bytes or local_weights_bytes(self.source)

    def memory(self, profile: Profile) -> Memory | None:
        return memory_for(self.spec, profile, self.weights_bytes)

    def profile_path(self, profile: Profile) -> tuple[str | int, ...]:
        return ("profiles", self.spec.profiles.index(profile))


@dataclass
class Context:
    entries: list[Entry]
    fleet: Fleet


Rule = Callable[[Context], Iterable[Finding]]


def all_rules() -> list[Rule]:
    from llmgw.rules import fleet, limits, memory, names, sources

    return [names.check, sources.check, limits.check, fleet.check, memory.check]


def run_rules(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule(ctx))
    return findings
