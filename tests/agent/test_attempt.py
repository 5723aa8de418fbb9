"""One attempt through AttemptRunner with a recording service and a stand-in for torchrun."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from service.contracts import AttemptNotRunning, FinishReport
from service.inventory import WorkerInventory
from service.launch import build_launch_plan
from service.recipe import parse_recipe
from worker.agent import rundir
from worker.agent.agent import Agent, AgentSettings
from worker.agent.attempt import AttemptRunner
from worker.agent.client import ServiceRefused
from worker.host_preflight.environment import master_port_in_use


class Service:
    """The worker API as the runner uses it; `finish` checks the body like the real route does."""

    def __init__(self, finish_status: int = 200) -> None:
        self.finishes: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.finish_status = finish_status

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        pass

    def send_log(self, attempt_id: str, offset: int, text: str, length: int) -> None:
        pass

    def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]:
        self.finishes.append(report)
        if self.finish_status == 409:
            raise AttemptNotRunning("failed")
        try:
            FinishReport.model_validate(report)
        except ValueError as exc:
            raise ServiceRefused(f"HTTP 422 {exc}", 422) from exc
        return {"job_status": report["status"]}


class Torchrun:
    """Stands in for AttemptProcess: records the launch, writes what rank 0 would, exits `code`."""

    launched: list[dict[str, str]] = []
    code = 0
    log_text = "step 1\n"

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path):
        Torchrun.launched.append(env)
        log_path.write_text(Torchrun.log_text)
        rundir.write_json(
            log_path.parent / rundir.RESULT_FILE,
            {"status": "succeeded" if self.code == 0 else "failed", "message": "done", "output_path": None},
        )
        self.pid = 1
        self.popen = self

    def poll(self) -> int:
        return self.code

    returncode = property(poll)


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """launch(env, service) -> (runner, service) after AttemptRunner.run() with host rules on ports only."""
    monkeypatch.setattr("worker.agent.host_check.run_host_preflight", _port_rules_only)
    monkeypatch.setattr("worker.agent.attempt.AttemptProcess", Torchrun)
    monkeypatch.setattr(Torchrun, "launched", [])
    inventory = WorkerInventory(
        cpu_slots=2, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
    )

    def run(
        env: dict[str, str] | None = None, service: Service | None = None
    ) -> tuple[AttemptRunner, Service]:
        service = service or Service()
        recipe = _recipe(env or {})
        plan = build_launch_plan(parse_recipe(recipe), inventory, job_id=1, attempt_number=1, devices=None)
        attempt = {"id": 7, "job_id": 1, "number": 1, "recipe": recipe, "plan": plan.model_dump()}
        runner = AttemptRunner(
            attempt,
            client=service,  # type: ignore[arg-type]
            inventory=inventory,
            stop=threading.Event(),
            ship_interval=0.01,
            agent_name="agent-a",
        )
        runner.run()
        return runner, service

    return run


def test_a_busy_pinned_master_port_is_replaced_in_the_launch(launch) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        pinned = str(busy.getsockname()[1])
        runner, service = launch({"MASTER_PORT": pinned})
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] != pinned
    recipe = rundir.read_json(runner.run_dir / rundir.RECIPE_FILE) or {}
    assert recipe["env"]["MASTER_PORT"] == env["MASTER_PORT"]
    plan = rundir.read_json(runner.run_dir / rundir.PLAN_FILE) or {}
    assert {v["name"]: v["value"] for v in plan["env"]}["MASTER_PORT"] == env["MASTER_PORT"]
    assert [f["status"] for f in service.finishes] == ["succeeded"]


def test_a_huge_log_still_reports_success_once(launch, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # 40 lines of 3,000 characters: over FinishReport's 64,000-character log_tail.
    monkeypatch.setattr(Torchrun, "log_text", "".join(f"{i:04d}" + "x" * 3000 + "\n" for i in range(40)))
    runner, service = launch()
    [finish] = service.finishes
    assert finish["status"] == "succeeded" and len(finish["log_tail"]) == 64_000
    assert finish["log_tail"].endswith("0039" + "x" * 3000)  # the end of the log is kept
    assert (rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {})["state"] == "finished"


def test_a_refused_finish_is_not_followed_by_an_agent_failure(
    launch, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    class Refusing(Service):
        def finish(self, attempt_id: str, report: dict[str, Any]) -> dict[str, Any]:
            self.finishes.append(report)
            raise ServiceRefused("HTTP 422", 422)

    _, service = launch(service=Refusing())
    assert [f["status"] for f in service.finishes] == ["succeeded"]


def test_an_agent_that_died_before_finish_reports_the_run_on_restart(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner, _ = launch()
    rundir.set_state(runner.run_dir, "running")  # as if the agent died before 'finish' was delivered
    attempt = rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {}
    assert (attempt["agent"], attempt["exit_code"]) == ("agent-a", 0)

    other = _agent(tmp_path, "agent-b", Service())
    other._recover()  # another agent sharing the runs directory leaves it alone
    assert other.client.finishes == []  # type: ignore[attr-defined]

    same = _agent(tmp_path, "agent-a", Service())
    same._recover()
    assert [f["status"] for f in same.client.finishes] == ["succeeded"]  # type: ignore[attr-defined]
    assert (rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {})["state"] == "finished"


def test_a_recovered_run_the_service_already_ended_is_left_finished(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner, _ = launch()
    rundir.set_state(runner.run_dir, "running")
    agent = _agent(tmp_path, "agent-a", Service(finish_status=409))
    agent._recover()
    assert (rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {})["state"] == "finished"


def _agent(tmp_path: Path, name: str, service: Service) -> Agent:
    settings = AgentSettings(
        service_url="http://unused", token="t", workspace=tmp_path, runs_dir=tmp_path / "runs", name=name
    )
    inventory = WorkerInventory(
        cpu_slots=2, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
    )
    agent = Agent(settings, inventory)
    agent.client.close()
    agent.client = service  # type: ignore[assignment]
    return agent


def _recipe(env: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "attempt-test",
        "model": {"path": "m"},
        "data": {"train": [{"path": "d.jsonl"}]},
        "resources": {"gpus_per_node": 2, "accelerator": "cpu"},
        "env": env,
    }


def _port_rules_only(recipe, inventory, workspace, devices):  # type: ignore[no-untyped-def]
    """The real E002 host rule; no model or data exists on disk in these tests."""
    from service.preflight.engine import check_stages, run_rules

    result = check_stages(recipe, lambda _, stage: run_rules(stage, [master_port_in_use]))
    return result
