"""What every rule is given: the valid entries, the fleet, what changed since the previous
plan, and a memo so a question thousands of profiles share is answered once."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field

from llmgw.compiler.catalogue import Entry
from llmgw.findings import Finding
from llmgw.model import Fleet, Profile


@dataclass
class Context:
    entries: list[Entry]
    fleet: Fleet
    # Files new or edited since the previous plan (by path and sha256); None without one.
    changed: frozenset[str] | None = None
    kubernetes: bool = False  # the plan is for --target kubernetes
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
