"""What a model's `source` names: one file, a repository, or a directory, and in what format."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlparse

from llmgw.hub import hub_source

Format = Literal["gguf", "safetensors", "bin", "repository", "unknown"]

WEIGHT_SUFFIXES = {".gguf": "gguf", ".safetensors": "safetensors", ".bin": "bin"}

# model-00001-of-00004.safetensors, Llama-70B-Q4_K_M-00001-of-00002.gguf
_SHARD = re.compile(r"-(\d{3,6})-of-(\d{3,6})\.[A-Za-z0-9]+$")


@dataclass(frozen=True)
class Source:
    text: str
    kind: Literal["hf-file", "hf-repo", "url", "path"]
    format: Format
    suffix: str  # the file's extension, "" for a repository or directory
    shard: tuple[int, int] | None  # (index, total) when the file is one part of several
    repository: str | None  # hf://org/repo for hf:// sources
    local: Path | None  # resolved path for local sources
    weight_files: tuple[Path, ...] = ()  # for a local directory: the weight files in it
    # Written inside the catalogue, but a symlink there leads out of it: nothing is read.
    leaves_catalogue: bool = False

    @property
    def several_files(self) -> bool:
        return self.shard is not None or len(self.weight_files) > 1

    @property
    def gguf_repository(self) -> bool:
        """A repository whose name or files say GGUF holds llama.cpp's files, never vLLM's:
        hf://bartowski/Llama-3.1-70B-GGUF handed to vLLM fails when the engine starts."""
        if self.repository is not None and "gguf" in self.repository.lower():
            return True
        return any(p.suffix == ".gguf" for p in self.weight_files)

    @property
    def missing(self) -> bool:
        """A local source that is not on this machine: a typo, or weights kept on the nodes."""
        return self.kind == "path" and self.local is not None and not self.local.exists()


def classify_source(text: str, base_dir: Path, catalogue: Path | None = None) -> Source:
    """Local paths are relative to the model file's own folder, like its $schema comment.

    A local path written inside `catalogue` that a symlink leads out of is not followed:
    lint's findings quote what they read (a header's first bytes, a size), and they are
    posted on the pull request, so a link to /etc/shadow must not be read at all. Its format
    is the one the path as written names, never the target's.
    """
    hub = hub_source(text)
    if hub is not None:
        if hub.filename is None:
            return Source(text, "hf-repo", "repository", "", None, hub.repository, None)
        return _file_source(text, "hf-file", PurePosixPath(hub.filename).name, hub.repository, None)
    if text.startswith(("https://", "http://")):
        name = PurePosixPath(urlparse(text).path).name
        return _file_source(text, "url", name, None, None)
    written = base_dir / text if not Path(text).is_absolute() else Path(text)
    if catalogue is not None and leads_out_through_a_link(written, catalogue):
        as_written = _file_source(text, "path", PurePosixPath(text).name, None, None)
        return replace(as_written, leaves_catalogue=True)
    local = written.resolve() if not Path(text).is_absolute() else Path(text)
    if local.is_dir():
        weights = tuple(sorted(p for p in local.iterdir() if p.suffix in WEIGHT_SUFFIXES))
        fmt: Format = "repository"
        if len(weights) == 1:
            fmt = WEIGHT_SUFFIXES[weights[0].suffix]  # type: ignore[assignment]
        return Source(text, "path", fmt, "", None, None, local, weights)
    return _file_source(text, "path", local.name, None, local)


def leads_out_through_a_link(written: Path, catalogue: Path) -> bool:
    """True when `written` is inside `catalogue` as written, and outside it once symlinks are
    followed, to anything but a weights file. A path written outside it (`../weights/m.gguf`,
    `/models/m.gguf`) is where the reviewer of the model file can see it point, and is read
    as it always was."""
    root = Path(os.path.abspath(catalogue))
    if not Path(os.path.normpath(os.path.abspath(written))).is_relative_to(root):
        return False
    try:
        target = written.resolve()
        if target.is_relative_to(catalogue.resolve()):
            return False
        # A weights file kept elsewhere and linked in (the hub's cache, a models disk, the
        # README's example) is what a link in a catalogue is for, and reading its header
        # quotes nothing but a weights file's: it is followed. Anything else is not.
        if target.suffix.lower() in WEIGHT_SUFFIXES and not target.exists():
            return False  # a weights file not there yet is missing (source-missing), not a leak
        return not (target.suffix.lower() in WEIGHT_SUFFIXES and target.is_file())
    except (OSError, RuntimeError):
        return True  # a loop of links leads nowhere lint should go


def _file_source(
    text: str, kind: Literal["hf-file", "url", "path"], name: str, repo: str | None, local: Path | None
) -> Source:
    suffix = PurePosixPath(name).suffix.lower()
    fmt: Format = WEIGHT_SUFFIXES.get(suffix, "unknown")  # type: ignore[assignment]
    match = _SHARD.search(name)
    shard = (int(match.group(1)), int(match.group(2))) if match else None
    if shard and shard[1] <= 1:
        shard = None
    return Source(text, kind, fmt, suffix, shard, repo, local)


def local_weights_bytes(source: Source) -> int | None:
    """The size on disk of a local source, when it is there to measure."""
    try:
        if source.weight_files:
            return sum(p.stat().st_size for p in source.weight_files)
        if source.local is not None and source.local.is_file():
            return source.local.stat().st_size
    except OSError:
        return None
    return None
