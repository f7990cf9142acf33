"""duplicate-name, alias-collision, duplicate-profile: every name answers to one thing."""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.findings import Finding
from llmgw.rules import Context, Entry


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
                "error", "duplicate-profile", ("profiles", i, "name"),
                f"profile '{profile.name}' appears twice in this model; give each profile its "
                "own name.",
            )
        seen.add(profile.name)


def _model_names(ctx: Context) -> Iterator[Finding]:
    # Files in path order: the first file to claim a name keeps it, and the
    # finding lands on the later one, which is usually the one being added.
    owners: dict[str, tuple[Entry, str]] = {}  # name -> (entry, "name" | "alias")
    for entry in sorted(ctx.entries, key=lambda e: e.doc.file):
        spec = entry.spec
        if spec.name in owners:
            other, how = owners[spec.name]
            rule = "duplicate-name" if how == "name" else "alias-collision"
            what = "model" if how == "name" else "alias of the model"
            yield entry.doc.finding(
                "error", rule, ("name",),
                f"'{spec.name}' is already the {what} in {other.doc.file}; "
                "two models cannot answer to one name. Rename one of them.",
            )
        else:
            owners[spec.name] = (entry, "name")
        for i, alias in enumerate(spec.aliases):
            if alias == spec.name:
                yield entry.doc.finding(
                    "error", "alias-collision", ("aliases", i),
                    f"alias '{alias}' repeats the model's own name; remove it.",
                )
                continue
            if alias in owners:
                other, how = owners[alias]
                what = "the name of the model" if how == "name" else "an alias of the model"
                yield entry.doc.finding(
                    "error", "alias-collision", ("aliases", i),
                    f"alias '{alias}' is already {what} in {other.doc.file} ({other.spec.name}); "
                    "a client sending it could reach either. Pick another alias.",
                )
                continue
            owners[alias] = (entry, "alias")
