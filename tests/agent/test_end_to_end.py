"""End to end with real processes: uvicorn service, CPU agents, torchrun with 2 gloo ranks, flightdeck.worker.train."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from flightdeck.cli.main import app
from flightdeck.worker.agent.process import group_members
from flightdeck.worker.checkpoints import find_resume_point

from .processes import USER_TOKEN, Agent, Service, tiny_recipe, wait_until

pytestmark = pytest.mark.slow


def _submit(api: httpx.Client, recipe: dict[str, Any], **params: Any) -> int:
    response = api.post("/jobs", json=recipe, params=params)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _job(api: httpx.Client, job_id: int) -> dict[str, Any]:
    response = api.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _wait_status(api: httpx.Client, job_id: int, statuses: set[str], timeout: float) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        job = _job(api, job_id)
        return job if job["status"] in statuses else None

    return wait_until(reached, timeout, f"job {job_id} to become one of {sorted(statuses)}")  # type: ignore[no-any-return]


def _steps(api: httpx.Client, job_id: int, attempt: int | None = None) -> list[int]:
    params: dict[str, Any] = {"limit": 10_000}
    if attempt is not None:
        params["attempt"] = attempt
    response = api.get(f"/jobs/{job_id}/metrics", params=params)
    assert response.status_code == 200, response.text
    return [point["step"] for point in response.json()["points"]]


def _wait_training(api: httpx.Client, job_id: int, step: int, timeout: float = 150) -> None:
    what = f"job {job_id} to log step {step}"
    wait_until(lambda: max(_steps(api, job_id), default=0) >= step, timeout, what)


def _log_text(api: httpx.Client, job_id: int) -> str:
    response = api.get(f"/jobs/{job_id}/logs", params={"max_bytes": 8 * 1024 * 1024})
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


def _why(api: httpx.Client, job: dict[str, Any]) -> str:
    """What a failed assertion on a job's status should show: its failure and the end of its log."""
    failure = {k: job.get(k) for k in ("status", "failure_class", "failure_code", "failure_message")}
    return f"{failure}\n--- job log (end) ---\n{_log_text(api, int(job['id']))[-4000:]}"


def _gone(pid: int) -> bool:
    return not group_members(pid)


def test_cancel_during_training_saves_a_checkpoint_first_and_leaves_no_process(cluster: Any) -> None:
    """With checkpoints on, a cancel gives the trainer its grace: SIGUSR1, a checkpoint at the next step
    (G017), then the stop; without them the same path stops at once (SIGTERM, grace, SIGKILL)."""
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "e2e-cancel")
    api = service.api()
    recipe = tiny_recipe(max_steps=100_000)
    recipe["training"]["save_steps"] = 100_000  # checkpoints on, none due
    job_id = _submit(api, recipe)
    _wait_training(api, job_id, 2)
    (pgid,) = agent.torchrun_pids()
    assert group_members(pgid), "torchrun should be running"
    assert api.post(f"/jobs/{job_id}/cancel").status_code == 202
    job = _wait_status(api, job_id, {"cancelled", "failed", "succeeded"}, 60)
    assert job["status"] == "cancelled", job
    assert _gone(pgid)  # reported only once no process of the attempt is left
    run_dir = job["attempts"][-1]["plan"]["run_dir"]
    assert not [p for p in _processes_mentioning(run_dir)]
    message = job["attempts"][-1]["message"]
    assert "the trainer saved a checkpoint first (stopped on SIGUSR1 after saving checkpoint-" in message, (
        message
    )
    saved = find_resume_point(Path(run_dir).with_name(Path(run_dir).name.replace("attempt-1", "attempt-2")))
    assert saved.found is not None and saved.skipped == []  # complete: a retry could resume from it


def test_killed_agent_loses_its_run_and_a_second_agent_runs_the_job(cluster: Any) -> None:
    service: Service = cluster("service", lease_seconds=4)
    first: Agent = cluster("agent", service, "e2e-doomed")
    api = service.api()
    # Long enough (~10 s of steps) that the first run is still going when its agent dies: metrics
    # reach the service in batches, so step 2 may be seen when a short run has already finished.
    steps = 400
    job_id = _submit(api, tiny_recipe(max_steps=steps), max_attempts=2)
    _wait_training(api, job_id, 2)
    (pgid,) = first.torchrun_pids()
    killed_at = time.monotonic()
    first.kill()  # SIGKILL: no clean-up code of the agent runs
    wait_until(lambda: _gone(pgid), 15, "the orphaned torchrun to die")
    print(f"torchrun gone {time.monotonic() - killed_at:.1f} s after the agent was killed")

    second: Agent = cluster("agent", service, "e2e-rescuer")
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    assert job["status"] == "succeeded", (job, second.log()[-3000:])
    lost, rerun = job["attempts"]
    assert (lost["failure_class"], rerun["status"]) == ("lease_lost", "succeeded")
    assert _steps(api, job_id) == list(range(1, steps + 1))


def test_killed_agent_fails_the_job_as_lease_lost_when_attempts_are_used_up(cluster: Any) -> None:
    service: Service = cluster("service", lease_seconds=3)
    agent: Agent = cluster("agent", service, "e2e-last")
    api = service.api()
    job_id = _submit(api, tiny_recipe(max_steps=100_000), max_attempts=1)
    _wait_training(api, job_id, 1)
    (pgid,) = agent.torchrun_pids()
    agent.kill()
    wait_until(lambda: _gone(pgid), 15, "the orphaned torchrun to die")
    job = _wait_status(api, job_id, {"failed", "succeeded", "cancelled"}, 30)
    assert (job["status"], job["failure_class"]) == ("failed", "lease_lost")


def test_service_restart_mid_run_loses_and_duplicates_nothing(cluster: Any) -> None:
    service: Service = cluster("service", lease_seconds=60)
    agent: Agent = cluster("agent", service, "e2e-restart")
    api = service.api()
    steps = 150
    job_id = _submit(api, tiny_recipe(max_steps=steps))
    _wait_training(api, job_id, 2)
    run_dir = Path(_job(api, job_id)["attempts"][-1]["plan"]["run_dir"])
    metrics = run_dir / "metrics.jsonl"
    service.stop()
    lines_at_stop = len(metrics.read_text().splitlines())
    # Training goes on while the service is down; what it writes waits on disk.
    wait_until(lambda: len(metrics.read_text().splitlines()) >= lines_at_stop + 10, 120, "steps while down")
    service.start()
    job = _wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 240)
    assert job["status"] == "succeeded", (job, agent.log()[-3000:])
    assert _steps(api, job_id) == list(range(1, steps + 1))
    assert _log_text(api, job_id) == (run_dir / "output.log").read_bytes().decode(errors="replace")


def _step_records(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["step"] for record in map(json.loads, lines) if record["type"] == "step"]


def test_a_fresh_database_on_a_used_workspace_never_reuses_a_run_directory(cluster: Any) -> None:
    """A user resets the service's data directory (a fresh database) and keeps the workspace and the
    worker: job and attempt ids start at 1 again, and job 1 used to write into, and ship from, the run
    directory the old database's job 1 had left (its steps ahead of the new job's, its output beside).
    A database restored from a backup keeps its folder: tests/agent/test_attempt.py and
    tests/service/test_database_identity.py cover it."""
    first: Service = cluster("service", data="data-before")
    agent: Agent = cluster("agent", first, "e2e-fresh-db", runs="shared")
    api = first.api()
    old_id = _submit(api, tiny_recipe(max_steps=3, processes=1))
    old = _wait_status(api, old_id, {"succeeded", "failed", "cancelled"}, 240)
    assert old["status"] == "succeeded", (old, agent.log()[-3000:])
    old_dir = Path(old["attempts"][-1]["plan"]["run_dir"])
    left = (old_dir / "metrics.jsonl").read_text()
    agent.stop()
    first.stop()

    second: Service = cluster("service", data="data-after")
    agent = cluster("agent", second, "e2e-fresh-db", runs="shared")
    api = second.api()
    new_id = _submit(api, tiny_recipe(max_steps=5, processes=1))
    assert new_id == old_id
    new = _wait_status(api, new_id, {"succeeded", "failed", "cancelled"}, 240)
    assert new["status"] == "succeeded", (new, agent.log()[-3000:])
    new_dir = Path(new["attempts"][-1]["plan"]["run_dir"])
    assert _step_records(new_dir) == [1, 2, 3, 4, 5]
    assert (old_dir / "metrics.jsonl").read_text() == left  # the old run is kept as it was
    assert new_dir.name == old_dir.name and new_dir != old_dir  # job 1, attempt 1 of another database
    assert _steps(api, new_id) == [1, 2, 3, 4, 5]
    shipped = {p["step"]: p["values"]["loss"] for p in api.get(f"/jobs/{new_id}/metrics").json()["points"]}
    written = [json.loads(line) for line in (new_dir / "metrics.jsonl").read_text().splitlines()]
    assert shipped == {r["step"]: pytest.approx(r["loss"]) for r in written if r["type"] == "step"}


def _processes_mentioning(text: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and text in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_data_errors_fail_the_attempt_with_their_fix_at_host_preflight_and_in_the_trainer(
    cluster: Any, tiny_workspace: Path
) -> None:
    service: Service = cluster("service")
    agent: Agent = cluster("agent", service, "e2e-preflight")
    api = service.api()
    recipe = tiny_recipe(max_steps=5)
    recipe["data"]["train"] = [{"path": "data/no-such-file.jsonl", "preset": "chartqa"}]
    job_id = _submit(api, recipe, max_attempts=1)
    job = _wait_status(api, job_id, {"failed", "succeeded", "cancelled"}, 120)
    assert (job["status"], job["failure_class"]) == ("failed", "preflight"), job
    assert "no-such-file" in job["failure_message"]
    assert job["failure_fix"] and job["failure_fix"].startswith("put the file"), job  # not "fix -"
    run_dir = Path(job["attempts"][-1]["plan"]["run_dir"])
    assert (run_dir / "recipe.json").exists() and not (run_dir / "output.log").exists()
    assert agent.torchrun_pids() == []
    events = api.get(f"/jobs/{job_id}/events").json()["events"]
    assert any(e["kind"] == "preflight" and e["severity"] == "error" for e in events)

    # OCR-VQA rows (several Q&A pairs each); row 1,050 lacks an answer: past the 1,000 rows the host
    # preflight reads, so the trainer finds it while converting the file, and its fix must still arrive.
    rows = [{"questions": ["title?", "author?"], "answers": ["t", "a"]}] * 1100
    rows[1049] = {"questions": ["title?", "author?"], "answers": ["t"]}
    data = tiny_workspace / "data" / "ocrvqa-late-d002.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tiny_recipe(max_steps=3, processes=1)
    recipe["data"]["train"] = [{"path": "data/ocrvqa-late-d002.jsonl", "preset": "ocrvqa"}]
    job_id = _submit(api, recipe, max_attempts=1)
    job = _wait_status(api, job_id, {"failed", "succeeded", "cancelled"}, 180)
    assert (job["status"], job["failure_class"], job["failure_code"]) == ("failed", "exit:1", "D002"), _why(
        api, job
    )
    assert "row 1050" in job["failure_message"]
    fix = "give every question of a row its answer at the same position"
    assert job["failure_fix"] and job["failure_fix"].startswith(fix), job
    ended = [e for e in api.get(f"/jobs/{job_id}/events").json()["events"] if e["kind"] == "attempt"]
    assert ended[-1]["fix"] == job["failure_fix"], ended
    shown = CliRunner().invoke(
        app, ["show", str(job_id), "--url", service.url, "--token", USER_TOKEN], env={"COLUMNS": "400"}
    )
    assert shown.exit_code == 0 and fix in shown.output, shown.output  # the failure's fix row, not "fix -"


def test_two_agents_share_the_queue_and_never_run_a_job_twice(cluster: Any) -> None:
    service: Service = cluster("service")
    agents = [cluster("agent", service, f"e2e-pair-{i}", slots=1) for i in range(2)]
    api = service.api()
    job_ids = [_submit(api, tiny_recipe(max_steps=4, name=f"pair-{i}", processes=1)) for i in range(3)]
    jobs = [_wait_status(api, job_id, {"succeeded", "failed", "cancelled"}, 300) for job_id in job_ids]
    assert [job["status"] for job in jobs] == ["succeeded"] * 3, [a.log()[-2000:] for a in agents]
    assert [len(job["attempts"]) for job in jobs] == [1, 1, 1]
    assert {job["worker_name"] for job in jobs} == {"e2e-pair-0", "e2e-pair-1"}
    assert sum(len(agent.torchrun_pids()) for agent in agents) == 3
