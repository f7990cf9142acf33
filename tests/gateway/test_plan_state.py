"""PlanState in one process: how the watcher and a deploy share one worker's plan."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from harness import model, plan, profile, write_plan

from llmgw.errors import PlanError
from llmgw.gateway.state import reload
from llmgw.gateway.state.reload import PlanState
from llmgw.plan import Plan, dump_plan


def plan_named(served: str) -> Plan:
    return plan([model("chat", [profile(["http://127.0.0.1:9"], served)])])


def test_a_deploy_during_the_watchers_read_is_not_undone_by_the_older_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan_named("first"))
    state = PlanState(path)
    older, deployed = plan_named("older"), plan_named("deployed")
    was_read, may_return = threading.Event(), threading.Event()
    real_read = reload.read_plan

    def slow_read(p: Path) -> Plan:
        doc = real_read(p)  # the older plan, read before the deploy replaces the file
        was_read.set()
        may_return.wait(10)
        return doc

    monkeypatch.setattr(reload, "read_plan", slow_read)

    async def race() -> None:
        write_plan(path, older)
        watcher = asyncio.create_task(state.check_file())
        assert await asyncio.to_thread(was_read.wait, 10), "the watcher never read the file"
        deploy = asyncio.create_task(state.accept(dump_plan(deployed.doc).encode()))
        for _ in range(5):  # let the deploy run as far as it can while the read is pending
            await asyncio.sleep(0)
        may_return.set()
        await asyncio.wait_for(asyncio.gather(watcher, deploy), 10)
        assert state.table.digest == deployed.digest, "the worker went back to the older plan"
        await state.check_file()  # nor may the next poll change anything
        assert state.table.digest == deployed.digest

    asyncio.run(race())
    assert state.refusal is None


def test_a_deploy_refused_by_one_worker_is_reported_by_another_until_a_plan_loads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.json"
    first = plan_named("first")
    write_plan(path, first)
    took_deploy, other = PlanState(path), PlanState(path)  # two workers on one plan file
    bad = dict(plan_named("bad").doc, digest="0" * 64)

    async def run() -> None:
        with pytest.raises(PlanError):
            await took_deploy.accept(dump_plan(bad).encode())
        await other.check_file()
        assert other.refusal == took_deploy.refusal, "the other worker does not say the deploy was refused"
        assert other.refusal and "digest" in other.refusal
        assert other.table.digest == first.digest
        # A worker started now (gunicorn replacing one that died) says so too.
        assert PlanState(path).refusal == took_deploy.refusal
        good = plan_named("good")
        write_plan(path, good)
        for state in (took_deploy, other):
            await state.check_file()
            assert state.refusal is None, "a plan that loaded still shows the old refusal"
            assert state.table.digest == good.digest
        assert PlanState(path).refusal is None, "the lapsed refusal came back in a new worker"

    asyncio.run(run())
