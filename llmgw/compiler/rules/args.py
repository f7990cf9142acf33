"""args-owned, args-risky: what a profile's `args` may add to the engine's command line.

The args are appended after the flags llmgw writes itself (llmgw/engines/), and both
engines take the last of a repeated flag: `args: [--host, 0.0.0.0, --port, "18555"]` once
passed lint and plan, and the engine listened on every interface, on a port the plan did
not know, where no key was asked for. What llmgw sets comes from the catalogue's own fields,
so a flag that sets it again is refused with the field to write instead. Flags that write or
serve files, or run code from the model's repository, are allowed but said, so the reviewer
of the pull request sees them in its comment. Each engine's module lists its own flags of
both kinds (`Engine.owned_flags`, `Engine.risky_flags`).
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.engines import engine
from llmgw.findings import Finding
from llmgw.model import Profile


def check(ctx: Context) -> Iterator[Finding]:
    for entry, profile in ctx.placed_profiles():
        yield from _check_args(entry, profile)


def _check_args(entry: Entry, profile: Profile) -> Iterator[Finding]:
    runs = engine(profile.engine)
    owned, risky = runs.owned_flags, runs.risky_flags
    for i, arg in enumerate(profile.args):
        flag = runs.flag_of(arg)
        if flag is None:
            continue
        path = (*entry.profile_path(profile), "args", i)
        if flag in owned:
            yield entry.doc.finding(
                "error",
                "args-owned",
                path,
                f"{arg} sets what llmgw sets itself for {profile.engine}: {owned[flag]}.",
            )
        elif flag in risky:
            yield entry.doc.finding(
                "warning",
                "args-risky",
                path,
                f"{arg} {risky[flag]}; keep it only if the node is meant to allow that, and "
                "the reviewer has read why.",
            )
