"""One valid model file, with what was learned about it: its source, its GGUF header when
the file is on disk, the architecture and memory estimate made from them.

Lint's rules and placement both read these; neither owns them, so they sit beneath both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from llmgw.compiler.memory import Memory, memory_for
from llmgw.compiler.source import Source, classify_source, local_weights_bytes
from llmgw.errors import InspectError, UsageError
from llmgw.load import Document
from llmgw.model import Architecture, ModelSpec, Profile

if TYPE_CHECKING:
    from llmgw.compiler.gguf_header import Header


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
        from llmgw.compiler.inspect import inspect

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
        from llmgw.compiler.inspect import architecture_block

        block = architecture_block(header)
        if block is None:
            return None, "nowhere"
        return Architecture.model_validate(block), "the GGUF header"

    def memory(self, profile: Profile) -> Memory | None:
        arch, where = self.architecture
        return memory_for(self.spec, profile, self.weights_bytes, arch, where)

    def profile_path(self, profile: Profile) -> tuple[str | int, ...]:
        return ("profiles", self.spec.profiles.index(profile))


MODEL_SUFFIXES = (".yaml", ".yml")


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
