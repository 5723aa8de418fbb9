"""One attempt through AttemptRunner with a recording service and a stand-in for torchrun."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from flightdeck.contracts import (
    RESULT_FILE,
    AttemptNotRunning,
    ClaimedAttempt,
    FinishReport,
    NodeStart,
    Registered,
)
from flightdeck.inventory import WorkerInventory
from flightdeck.launch import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.run_variables import RESUME_VARIABLE
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.agent import Agent, AgentSettings
from flightdeck.worker.agent.attempt import AttemptRunner
from flightdeck.worker.agent.client import ServiceRefused
from flightdeck.worker.checkpoints import mark_complete
from flightdeck.worker.executors.inprocess import InProcessExecutor
from flightdeck.worker.host_preflight.environment import master_port_in_use
from flightdeck.worker.host_preflight.ports import ResolvedPort, resolve_master_port


class Service:
    """The worker API as the runner uses it; `finish` checks the body like the real route does."""

    def __init__(self, finish_status: int = 200) -> None:
        self.finishes: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.finish_status = finish_status
        self.ready_calls: list[tuple[int, int | None]] = []
        self.barrier: list[dict[str, Any]] = []

    def send_events(self, attempt_id: str, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    def send_metrics(self, attempt_id: str, points: list[dict[str, Any]]) -> None:
        pass

    def send_log(self, attempt_id: str, offset: int, text: str, length: int, node: int | None = None) -> None:
        pass

    def node_ready(self, attempt_id: str, node_rank: int, port: int | None) -> NodeStart:
        """The start barrier: answers from `self.barrier` in turn (the last one repeats), read into the
        contract's model as the real client reads them."""
        self.ready_calls.append((node_rank, port))
        return NodeStart.model_validate(self.barrier[min(len(self.ready_calls), len(self.barrier)) - 1])

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
            log_path.parent / RESULT_FILE,
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
    monkeypatch.setattr("flightdeck.worker.agent.host_check.run_host_preflight", _port_rules_only)
    monkeypatch.setattr("flightdeck.worker.agent.attempt.AttemptProcess", Torchrun)
    monkeypatch.setattr(Torchrun, "launched", [])
    inventory = WorkerInventory(
        cpu_slots=2, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
    )

    def run(
        env: dict[str, str] | None = None,
        service: Service | None = None,
        node_rank: int | None = None,
        health: dict[str, Any] | None = None,
        claimed_at: float | None = None,
        number: int = 1,
        job_started_at: float | None = None,
    ) -> tuple[AttemptRunner, Service]:
        service = service or Service()
        recipe = _recipe(env or {}) | ({"health": health} if health else {})
        if number > 1:  # a retry of a recipe that saves checkpoints looks for one
            recipe["training"] = {"save_steps": 1}
        if node_rank is not None:  # a node of a two-node attempt
            recipe["resources"] = recipe.get("resources", {}) | {"nodes": 2, "gpus_per_node": 1}
        plan = build_launch_plan(
            parse_recipe(recipe),
            inventory,
            job_id=1,
            database="db",
            attempt_number=number,
            devices=None,
            node_rank=node_rank or 0,
            master_addr="127.0.0.1" if node_rank is not None else None,
        )
        attempt: dict[str, Any] = {
            "id": 7 + number - 1,
            "job_id": 1,
            "number": number,
            "recipe": recipe,
            "plan": plan.model_dump(),
            "lease_seconds": 60.0,
            "claimed_at": claimed_at,
            "job_started_at": job_started_at,
        }
        if node_rank is not None:
            attempt["node"] = {"rank": node_rank, "nnodes": 2, "master_addr": "127.0.0.1"}
        runner = AttemptRunner(
            ClaimedAttempt.model_validate(attempt),
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
    assert recipe["env"]["MASTER_PORT"] == pinned  # host preflight reported E002 and changed nothing
    plan = rundir.read_json(runner.run_dir / rundir.PLAN_FILE) or {}
    [port] = [v for v in plan["env"] if v["name"] == "MASTER_PORT"]
    assert port["value"] == env["MASTER_PORT"] and port["code"] == "E002" and pinned in port["reason"]
    assert [e["code"] for e in service.events if e["key"] == "launch:port"] == ["E002"]
    assert [f["status"] for f in service.finishes] == ["succeeded"]


def test_an_agent_fault_fails_the_attempt_as_agent_naming_where(launch, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(*_: object, **__: object) -> None:
        raise TypeError('can only concatenate str (not "list") to str')

    monkeypatch.setattr("flightdeck.worker.agent.attempt.run_host_check", broken)
    _, service = launch({})
    [finish] = service.finishes
    assert (finish["status"], finish["failure_class"]) == ("failed", "agent"), finish
    assert (
        "TypeError" in finish["message"]
        and "test_attempt.py:" in finish["message"]
        and "in broken" in finish["message"]
    )
    assert "report it with the agent's log" in finish["fix"]


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[ResolvedPort]:
    """Every port the runner resolves, through the real resolve_master_port."""
    made: list[ResolvedPort] = []

    def counted(pinned: str | None) -> ResolvedPort:
        made.append(resolve_master_port(pinned))
        return made[-1]

    monkeypatch.setattr("flightdeck.worker.agent.attempt.resolve_master_port", counted)
    return made


@pytest.mark.parametrize("pinned", ["none", "free", "busy"])
def test_a_single_node_attempt_resolves_its_port_once_and_launches_on_it_unchanged(
    launch, resolutions: list[ResolvedPort], pinned: str
) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as held:
        held.bind(("", 0))
        if pinned == "busy":
            held.listen()
        port = str(held.getsockname()[1])
        if pinned == "free":
            held.close()
        runner, service = launch({"MASTER_PORT": port} if pinned != "none" else {})
    [resolved] = resolutions
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == str(resolved.port)
    assert (resolved.port == int(port)) == (pinned == "free")
    plan = rundir.read_json(runner.run_dir / rundir.PLAN_FILE) or {}
    recorded = {v["name"]: v for v in plan["env"]}
    assert recorded["MASTER_PORT"]["value"] == recorded["PET_MASTER_PORT"]["value"] == str(resolved.port)
    assert resolved.reason in recorded["MASTER_PORT"]["reason"]
    [event] = [e for e in service.events if e["key"] == "launch:port"]
    assert event["message"] == f"MASTER_PORT {resolved.port}: {resolved.reason}"


def test_gang_nodes_launch_on_node_zeros_port_and_only_node_zero_resolves_one(
    launch, resolutions: list[ResolvedPort]
) -> None:  # type: ignore[no-untyped-def]
    service = Service()
    service.barrier = [_GO | {"master_port": 29999}]
    launch(service=service, node_rank=1)
    assert resolutions == []  # node 1 takes node 0's port from the barrier
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29999"

    Torchrun.launched.clear()
    node0 = Service()
    node0.node_ready = lambda attempt_id, rank, port: NodeStart.model_validate(_GO | {"master_port": port})  # type: ignore[method-assign]
    launch(service=node0, node_rank=0)
    [resolved] = resolutions
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == str(resolved.port)


def test_an_attempt_made_again_with_the_same_id_does_not_run_in_what_the_earlier_one_left(launch) -> None:  # type: ignore[no-untyped-def]
    """A database restored from a backup: attempt 7 of job 1 again, in the same run directory, made at
    another moment. The earlier run's metrics are not this run's, and its output is set aside."""
    first, _ = launch(claimed_at=1_700_000_000.5)
    (first.run_dir / "metrics.jsonl").write_text('{"type": "step", "step": 1}\n')
    (first.run_dir / "output" / "model.bin").write_bytes(b"earlier")
    again, service = launch(claimed_at=1_700_000_900.25)
    assert again.run_dir == first.run_dir and service.finishes[0]["status"] == "succeeded"
    assert not (again.run_dir / "metrics.jsonl").exists()
    assert (again.run_dir / "replaced-1" / "output" / "model.bin").read_bytes() == b"earlier"
    assert (rundir.read_json(again.run_dir / rundir.ATTEMPT_FILE) or {})["claimed_at"] == 1_700_000_900.25


def test_a_retry_resumes_only_from_attempts_its_job_made_in_this_database(launch) -> None:  # type: ignore[no-untyped-def]
    """Attempt 1's run directory on this host holds a complete checkpoint. Made for another start of the
    job (a lost timeline of a restored database), attempt 2 starts from step 0; made for this one, it
    resumes from it. The runner records the job's start in attempt.json for the next retry to compare."""
    first, _ = launch(claimed_at=1_700_000_000.5, job_started_at=1_700_000_000.5)
    assert (rundir.read_json(first.run_dir / rundir.ATTEMPT_FILE) or {})["job_started_at"] == 1_700_000_000.5
    checkpoint = first.run_dir / "output" / "stage-0" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.bin").write_bytes(b"x")
    mark_complete(checkpoint, 3)
    Torchrun.launched.clear()
    _, service = launch(claimed_at=1_700_000_950.0, number=2, job_started_at=1_700_000_900.25)
    assert Torchrun.launched[0].get(RESUME_VARIABLE, "") == ""
    assert any(e["message"].startswith("no complete checkpoint") for e in service.events)
    Torchrun.launched.clear()
    launch(claimed_at=1_700_000_950.0, number=2, job_started_at=1_700_000_000.5)
    assert Torchrun.launched[0][RESUME_VARIABLE] == str(checkpoint)


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
    # The same agent registered with another database: attempt ids there name other attempts.
    elsewhere = _agent(tmp_path, "agent-a", Service(), database="another")
    elsewhere._recover()
    assert elsewhere.client.finishes == []  # type: ignore[attr-defined]

    same = _agent(tmp_path, "agent-a", Service())
    same._recover()
    assert [f["status"] for f in same.client.finishes] == ["succeeded"]  # type: ignore[attr-defined]
    assert (rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {})["state"] == "finished"


class Registering(Service):
    """The registration route as the agent uses it, answering with the id of the service's database."""

    def __init__(self, database: str) -> None:
        super().__init__()
        self.database, self.token = database, "enrolment"

    def register(self, name: str, inventory: Any, **_: Any) -> Registered:
        return Registered(
            id=3, name=name, lease_seconds=30, heartbeat_interval=5, token="own", database=self.database
        )

    def use_token(self, token: str) -> None:
        self.token = token


def test_an_executor_whose_attempts_outlive_it_remembers_the_database_it_registered_with(
    tmp_path: Path,
) -> None:
    """A Slurm executor restarted looks for its attempts in that database's folder (worker/slurm/)."""

    class Adopting(InProcessExecutor):
        remembered: tuple[Any, ...] = ()

        def saved_identity(self) -> None:
            return None

        def remember_identity(self, *identity: Any) -> None:
            self.remembered = identity

        def held_attempts(self) -> list[str]:
            return []

        def adopt(self, keep: list[str], stop: list[str]) -> list[Any]:
            return []

    agent = _agent(tmp_path, "slurm-a", Registering("20261127-0a1b2c3d"), database="")
    agent.executor = executor = Adopting(agent.executor_setup())
    agent._register_and_adopt(executor)
    assert executor.remembered == ("3", "own", 5, "20261127-0a1b2c3d")


def test_registration_tells_the_agent_its_databases_folder_and_recovery_looks_only_there(  # type: ignore[no-untyped-def]
    launch, tmp_path: Path
) -> None:
    runner, _ = launch()  # its run directory is in <runs>/db/
    rundir.set_state(runner.run_dir, "running")

    for database, reported in (("another", []), ("db", ["succeeded"])):
        service = Registering(database)
        agent = _agent(tmp_path, "agent-a", service, database="")
        agent._register()
        assert agent.database == database
        agent._recover()
        assert [f["status"] for f in service.finishes] == reported


def test_a_recovered_run_the_service_already_ended_is_left_finished(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    runner, _ = launch()
    rundir.set_state(runner.run_dir, "running")
    agent = _agent(tmp_path, "agent-a", Service(finish_status=409))
    agent._recover()
    assert (rundir.read_json(runner.run_dir / rundir.ATTEMPT_FILE) or {})["state"] == "finished"


def _agent(tmp_path: Path, name: str, service: Service, database: str = "db") -> Agent:
    settings = AgentSettings(
        service_url="http://unused", token="t", workspace=tmp_path, runs_dir=tmp_path / "runs", name=name
    )
    inventory = WorkerInventory(
        cpu_slots=2, cores=2, workspace=str(tmp_path), runs_dir=str(tmp_path / "runs")
    )
    agent = Agent(settings, inventory)
    agent.client.close()
    agent.client = service  # type: ignore[assignment]
    agent.database = database  # as registration sets it
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
    from flightdeck.preflight.engine import check_stages, run_rules

    result = check_stages(recipe, lambda _, stage: run_rules(stage, [master_port_in_use]))
    return result


_GO = {"start": True, "abort": None, "master_addr": "127.0.0.1", "master_port": 29999, "waiting_for": []}
_WAIT = {"start": False, "abort": None, "master_addr": "127.0.0.1", "master_port": None, "waiting_for": [0]}


def test_a_node_starts_torchrun_only_once_every_node_is_ready_with_node_zeros_port(launch) -> None:  # type: ignore[no-untyped-def]
    service = Service()
    service.barrier = [_WAIT, _WAIT, _GO]
    launch(service=service, node_rank=1)
    assert service.ready_calls == [(1, None)] * 3  # only node 0 reports a port
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29999"
    assert [f["status"] for f in service.finishes] == ["succeeded"]
    # Its host's events keep their own keys beside node 0's and say which node they come from.
    assert service.events and all(e["key"].startswith("node1:") for e in service.events)
    assert all(e["message"].startswith("node 1: ") for e in service.events)


def test_node_zero_reports_a_free_port_and_launches_with_it(launch) -> None:  # type: ignore[no-untyped-def]
    service = Service()
    service.barrier = [_GO | {"master_port": None}]  # the answer's port is node 0's own

    def ready(attempt_id: str, node_rank: int, port: int | None) -> NodeStart:
        service.ready_calls.append((node_rank, port))
        return NodeStart.model_validate(_GO | {"master_port": port})

    service.node_ready = ready  # type: ignore[method-assign]
    launch(service=service, node_rank=0)
    [(rank, port)] = service.ready_calls
    assert rank == 0 and port is not None
    [env] = Torchrun.launched
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == str(port)


def test_a_node_whose_peer_failed_host_preflight_never_launches(launch) -> None:  # type: ignore[no-untyped-def]
    service = Service()
    service.barrier = [_WAIT, _WAIT | {"abort": "node 0 (w0) failed"}]
    launch(service=service, node_rank=1)
    assert Torchrun.launched == []
    [finish] = service.finishes
    assert finish["status"] == "cancelled" and "node 0 (w0) failed" in finish["message"]


# --- H006: where the survivors were when a rank died -------------------------------------------

RANK_KILLED_LOG = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4609)  (SIGKILL)
"""
# What worker/train/stack_dumps.py leaves when torchrun SIGTERMs a rank waiting in a collective.
SURVIVOR_DUMP = """Current thread 0x00007f2b9a1b4740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2815 in all_reduce
  File "/ws/worker/train/health.py", line 77 in any_rank
"""


def test_a_dead_ranks_failure_says_where_the_survivors_were(launch, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    def dumped_survivor(self, argv, env, cwd, log_path):  # type: ignore[no-untyped-def]
        Torchrun.__init__(self, argv, env, cwd, log_path)
        (log_path.parent / "stacks").mkdir()
        (log_path.parent / "stacks" / "rank-0.txt").write_text(SURVIVOR_DUMP)
        (log_path.parent / "stacks" / "rank-1.txt").write_text("")  # SIGKILL: no dump

    monkeypatch.setattr(Torchrun, "code", 1)
    monkeypatch.setattr(Torchrun, "log_text", RANK_KILLED_LOG)
    monkeypatch.setattr(
        "flightdeck.worker.agent.attempt.AttemptProcess",
        type("T", (Torchrun,), {"__init__": dumped_survivor}),
    )
    _, service = launch()
    [finish] = service.finishes
    assert finish["failure_code"] == "H005"
    first_line = finish["message"].splitlines()[0]
    assert first_line.endswith(
        "rank 1 was killed by signal 9 (SIGKILL); where the ranks were: rank 0 in `all_reduce` "
        "(torch/distributed/distributed_c10d.py:2815) from `any_rank()` at health.py:77"
    ), finish["message"]
    assert finish["ranks"].startswith("rank 0 in `all_reduce`") and not finish["ranks_apart"]
    assert [e["key"] for e in service.events if e["key"].startswith("stacks:")] == ["stacks:when a rank died"]


class HungLeaving(Torchrun):
    """Both ranks said they exit 42 after a health stop (G001 in result.json) and never exit: a hang in
    the group's teardown, as NCCL's destroy_process_group can (stands in for that torchrun)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path):
        super().__init__(argv, env, cwd, log_path)
        run_dir = log_path.parent
        rundir.write_json(
            run_dir / RESULT_FILE,
            {"status": "failed", "failure_code": "G001", "message": "no adapter gradient", "fix": "unfreeze"},
        )
        for rank in (0, 1):
            rundir.write_json(run_dir / f"script-end-rank{rank}.json", {"rank": rank, "exit_code": 42})
        self.stopped = False

    def poll(self) -> int | None:  # type: ignore[override]
        return -15 if self.stopped else None

    def living(self) -> list[Any]:
        return []

    def stop(self, grace: float) -> list[Any]:
        self.stopped = True
        return []


def test_a_recipe_hung_leaving_after_a_health_stop_fails_with_that_stop_and_an_h008_warning(
    launch, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("flightdeck.worker.agent.attempt.AttemptProcess", HungLeaving)
    _, service = launch(health={"teardown_grace_seconds": 1})
    [finish] = service.finishes
    assert (finish["status"], finish["failure_code"], finish["failure_class"]) == (
        "failed",
        "G001",
        "health:G001",
    )
    [h008] = [e for e in service.events if e.get("code") == "H008"]
    assert h008["severity"] == "warn" and "torchrun was still running 1 s later" in h008["message"], h008


class CrashedLeaving(Torchrun):
    """Both ranks' scripts returned (their end markers, exit code 0), then rank 1 died as its process
    exited: what a gloo group's thread torn down at interpreter exit does ("terminate called without an
    active exception", SIGABRT). `ended`: the ranks that wrote their marker."""

    ended = (0, 1)

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path):
        super().__init__(argv, env, cwd, log_path)
        for left in log_path.parent.glob("script-end-rank*.json"):  # a launch before, in the same run dir
            left.unlink()
        for rank in self.ended:
            rundir.write_json(log_path.parent / f"script-end-rank{rank}.json", {"rank": rank, "exit_code": 0})


RANK_ABORTED_LOG = """finished
finished
terminate called without an active exception
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 17597)  (SIGABRT)
"""


def test_a_run_that_ended_on_every_rank_then_crashed_as_it_exited_succeeds_with_h008(
    launch, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The work was done on every rank (the trainer's end markers; a script's are written the same way,
    when its main code returns): a crash in teardown is a warning, not the job's failure. A rank that
    died before its end is still H005."""
    monkeypatch.setattr(Torchrun, "code", 1)
    monkeypatch.setattr(Torchrun, "log_text", RANK_ABORTED_LOG)
    monkeypatch.setattr("flightdeck.worker.agent.attempt.AttemptProcess", CrashedLeaving)
    _, service = launch()
    [finish] = service.finishes
    assert finish["status"] == "succeeded", finish
    [h008] = [e for e in service.events if e.get("code") == "H008"]
    assert h008["severity"] == "warn" and "a crash in teardown" in h008["message"], h008
    assert "rank 1 was killed by signal 6 (SIGABRT)" in h008["message"], h008
    assert h008["fix"].startswith("nothing to change in the recipe")

    monkeypatch.setattr(CrashedLeaving, "ended", (0,))  # rank 1 died before its end
    _, service = launch()
    [finish] = service.finishes
    assert (finish["status"], finish["failure_code"]) == ("failed", "H005"), finish
    assert not [e for e in service.events if e.get("code") == "H008"]
