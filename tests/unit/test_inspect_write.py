"""`llmgw inspect catalog/NAME.yaml --write`: the header's facts go into the model file, and
the diff shows only the lines that changed."""

from __future__ import annotations

import difflib
from pathlib import Path

from ruamel.yaml import YAML

from tests.unit.gguf_files import write_gguf

MODEL = """\
# yaml-language-server: $schema=../schema/model.schema.json
# A comment at the top stays.
name: tiny
description: "Quoted, and long enough that a careless writer would fold it at eighty columns, twice."
aliases: ['single-quoted', plain]

source: models/tiny.gguf   # beside the catalogue
context_length: 2048

# Profiles: one for CPUs.
profiles:
  - name: cpu
    engine: llamacpp
    args: [--parallel, "2"]
"""


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def _catalogue(tmp_path: Path, text: str = MODEL) -> Path:
    (tmp_path / "catalog" / "models").mkdir(parents=True)
    write_gguf(tmp_path / "catalog" / "models" / "tiny.gguf", "gemma3", layers=6, heads=4, kv_heads=1,
               embedding=256, key_length=128, value_length=128, window=512, context=32768)
    model = tmp_path / "catalog" / "tiny.yaml"
    model.write_text(text)
    return model


def test_write_adds_weights_and_architecture_and_nothing_else(llmgw, tmp_path):
    model = _catalogue(tmp_path)
    run = llmgw("inspect", "catalog/tiny.yaml", "--write", cwd=tmp_path)
    assert run.code == 0, run
    assert "Wrote weights_bytes and architecture into catalog/tiny.yaml." in run.stderr
    after = model.read_text()
    size = (tmp_path / "catalog" / "models" / "tiny.gguf").stat().st_size
    assert _changed_lines(MODEL, after) == [
        f"+weights_bytes: {size}",
        "+architecture:",
        "+  name: gemma3",
        "+  layers: 6",
        "+  heads: 4",
        "+  kv_heads: 1",
        "+  head_dim: 128",
        "+  value_dim: 128",
        "+  sliding_window: 512",
        "+  sliding_window_layers: 5",
        "+  embedding_length: 256",
        "+  feed_forward_length: 512",
        "+  vocab_size: 300",
        "+  trained_context: 32768",
    ], after


def test_written_file_still_lints_and_its_estimate_reads_the_architecture(llmgw, tmp_path):
    _catalogue(tmp_path)
    llmgw("inspect", "catalog/tiny.yaml", "--write", cwd=tmp_path)
    (tmp_path / "fleet.yaml").write_text(
        "nodes:\n  - {name: n1, address: 127.0.0.1, memory_gb: 8, engines: [llamacpp]}\n")
    run = llmgw("plan", "--out", "-", cwd=tmp_path)
    assert run.code == 0, run
    assert "; architecture from the model file" in run.stdout, run


def test_an_existing_flow_mapping_is_updated_in_place(llmgw, tmp_path):
    text = MODEL.replace("context_length: 2048\n",
                         "weights_bytes: 1   # stale\n"
                         "# Known architecture.\n"
                         "architecture: {layers: 2, kv_heads: 1, head_dim: 128, kv_bytes: 1}\n"
                         "context_length: 2048\n")
    model = _catalogue(tmp_path, text)
    assert llmgw("inspect", "catalog/tiny.yaml", "--write", cwd=tmp_path).code == 0
    after = model.read_text()
    changed = _changed_lines(text, after)
    assert len(changed) == 4, changed  # two lines out, the same two lines in
    assert "# Known architecture.\n" in after and "# stale" in after
    arch = YAML(typ="safe").load(after)["architecture"]
    assert arch["layers"] == 6 and arch["kv_bytes"] == 1  # the cache type is the person's


def test_writing_twice_changes_nothing_the_second_time(llmgw, tmp_path):
    model = _catalogue(tmp_path)
    llmgw("inspect", "catalog/tiny.yaml", "--write", cwd=tmp_path)
    first = model.read_text()
    run = llmgw("inspect", "catalog/tiny.yaml", "--write", cwd=tmp_path)
    assert run.code == 0, run
    assert "already says what the header says; nothing written" in run.stderr
    assert model.read_text() == first


def test_inspecting_a_model_file_without_write_leaves_it_alone(llmgw, tmp_path):
    model = _catalogue(tmp_path)
    run = llmgw("inspect", "catalog/tiny.yaml", cwd=tmp_path)
    assert run.code == 0, run
    assert "gemma3" in run.stdout
    assert model.read_text() == MODEL
