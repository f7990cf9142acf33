"""duplicate-name, alias-collision, duplicate-profile: every name answers to one thing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.findings import Finding


def check(ctx: Context) -> Iterator[Finding]:
    yield from _model_names(ctx)
    for entry in ctx.entries:
        yield from _profile_names(entry)


def _profile_names(entry: Entry) -> Iterator[Finding]:
    # Replicas, routing, the dashboard and the diff all know a profile by its name.
    seen: set[str] = set()
    for i, profile in enumerate(entry.spec.profiles):
        if profile.name in seen:
            yield entry.doc.finding(
                "error",
                "duplicate-profile",
                ("profiles", i, "name"),
                f"profile '{profile.name}' appears twice in this model; give each profile its own name.",
            )
        seen.add(profile.name)


@dataclass(frozen=True)
class _Claim:
    """One model answering to a word: by its name, or by one of its aliases."""

    entry: Entry
    alias: int | None  # index in aliases; None for the name

    @property
    def path(self) -> tuple[str | int, ...]:
        return ("name",) if self.alias is None else ("aliases", self.alias)

    def describe(self) -> str:
        if self.alias is None:
            return f"the name of the model in {self.entry.doc.file}"
        return f"an alias of the model in {self.entry.doc.file} ({self.entry.spec.name})"


def _model_names(ctx: Context) -> Iterator[Finding]:
    claims: dict[str, list[_Claim]] = {}
    for entry in sorted(ctx.entries, key=lambda e: e.doc.file):
        claims.setdefault(entry.spec.name, []).append(_Claim(entry, None))
        for i, alias in enumerate(entry.spec.aliases):
            if alias == entry.spec.name:
                yield entry.doc.finding(
                    "error",
                    "alias-collision",
                    ("aliases", i),
                    f"alias '{alias}' repeats the model's own name; remove it.",
                )
                continue
            claims.setdefault(alias, []).append(_Claim(entry, i))
    for word, held in claims.items():
        if len({c.entry.doc.file for c in held}) < 2:
            continue
        blamed = {id(e) for e in ctx.to_blame([c.entry for c in held])}
        for claim in held:
            if id(claim.entry) in blamed:
                yield _clash(ctx, word, claim, [c for c in held if c.entry is not claim.entry])


def _clash(ctx: Context, word: str, claim: _Claim, others: list[_Claim]) -> Finding:
    # "already" only when the others were there in the previous plan: without one, which
    # file came first is not known, and each file of the clash names the others.
    when = "already" if not any(ctx.is_new(o.entry) for o in others) else "also"
    them = "; and ".join(o.describe() for o in others)
    if claim.alias is not None:
        return claim.entry.doc.finding(
            "error",
            "alias-collision",
            claim.path,
            f"alias '{word}' is {when} {them}; a client sending it could reach either. Pick another alias.",
        )
    if any(o.alias is None for o in others):
        return claim.entry.doc.finding(
            "error",
            "duplicate-name",
            claim.path,
            f"'{word}' is {when} {them}; two models cannot answer to one name. Rename one of them.",
        )
    return claim.entry.doc.finding(
        "error",
        "alias-collision",
        claim.path,
        f"'{word}' is {when} {them}; a client sending it could reach either. "
        "Rename this model, or remove that alias.",
    )
