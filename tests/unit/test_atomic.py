"""Replacing a file: what a reader sees, and what a symlink at the name cannot make it do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw import atomic
from llmgw.atomic import replace_file


def test_an_owned_file_behind_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / ".plan.json.last-good").symlink_to(victim)
    with pytest.raises(OSError) as refused:
        replace_file(tmp_path / ".plan.json.last-good", b"new", owned=True)
    assert "symlink" in str(refused.value) and "remove it" in str(refused.value)
    assert victim.read_text() == "precious"


def test_a_symlink_placed_at_a_guessable_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for tag in ("tmp", "refusal"):
        (tmp_path / f".plan.json.{tag}{os.getpid()}").symlink_to(victim)
    replace_file(tmp_path / "plan.json", b"new")
    replace_file(tmp_path / "refused", b"new", tag="refusal", owned=True)
    assert victim.read_text() == "precious"
    assert (tmp_path / "plan.json").read_bytes() == b"new"


def test_the_data_and_the_rename_are_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    replace_file(tmp_path / "f", b"data", owned=True)
    assert len(synced) == 2, "the file before the rename, and its folder after"
    assert (tmp_path / "f").read_bytes() == b"data"
