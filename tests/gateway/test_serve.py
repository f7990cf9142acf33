"""What `llmgw serve` leaves behind: the metrics directory of each run."""

from __future__ import annotations

from pathlib import Path

import httpx
from harness import Engine, gateway, model, plan, profile, write_plan


def plan_file(where: Path, engine: Engine) -> Path:
    path = where / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine.url], "chat")])]))
    return path


def test_the_metrics_directory_made_for_a_run_is_removed_when_it_ends(
    tmp_path: Path, engine_a: Engine
) -> None:
    with gateway(plan_file(tmp_path, engine_a), workers=1) as gw:
        made = Path(gw.env["PROMETHEUS_MULTIPROC_DIR"])
        assert httpx.get(gw.url + "/metrics", timeout=10).status_code == 200
        assert any(made.glob("*.db")), "the worker keeps its metrics there"
    assert not made.exists(), "every restart would leave one more directory in /tmp"


def test_a_kept_metrics_directory_loses_the_last_runs_files_at_start(
    tmp_path: Path, engine_a: Engine
) -> None:
    kept = tmp_path / "metrics"
    kept.mkdir()
    stale = kept / "counter_999999.db"  # a pid from the last run, not a valid file at all
    stale.write_bytes(b"stale")
    mine = kept / "README"
    mine.write_text("the operator's own file\n")
    with gateway(plan_file(tmp_path, engine_a), workers=1, PROMETHEUS_MULTIPROC_DIR=str(kept)) as gw:
        assert not stale.exists(), "its counts would be added to this run's"
        assert httpx.get(gw.url + "/metrics", timeout=10).status_code == 200
    assert kept.is_dir() and mine.exists(), "a directory the operator chose is theirs"
