"""Lint rules: each family is a module whose `check(ctx)` yields findings.

Every rule sees only models that passed the schema, so it can trust types and
defaults; a rule never prints and never stops the others. What a rule is given is in
rules/context.py; the model files themselves in llmgw/compiler/catalogue.py.
"""

from __future__ import annotations

from llmgw.compiler.rules import (
    args,
    embedding,
    external,
    fallbacks,
    fleet,
    limits,
    memory,
    names,
    on_demand,
    sources,
)
from llmgw.compiler.rules.context import Context, Rule
from llmgw.findings import Finding


def all_rules() -> list[Rule]:
    return [
        names.check,
        sources.check,
        args.check,
        limits.check,
        embedding.check,
        fleet.check,
        memory.check,
        external.check,
        on_demand.check,
        fallbacks.check,
    ]


def run_rules(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule(ctx))
    return findings
