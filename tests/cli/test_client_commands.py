"""The user commands against a real service on 127.0.0.1, with jobs driven through the worker API by hand."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flightdeck.cli.main import app
from flightdeck.memory.reference_models import LLAMA2_7B
from tests.cli.live_service import USER_TOKEN, WORKER_TOKEN, LiveService, minimal_recipe


def run(runner: CliRunner, service: LiveService, *args: str) -> Any:
    return runner.invoke(app, [*args, "--url", service.url, "--token", USER_TOKEN])


def recipe_file(tmp_path: Path, recipe: dict[str, Any]) -> Path:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    return path


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_submit_checks_locally_prints_findings_job_id_and_next_commands(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    result = run(runner, service, "submit", str(recipe_file(tmp_path, minimal_recipe("my-run"))))

    assert result.exit_code == 0, result.output
    stored = service.user.get("/jobs").json()["data"]
    assert [j["name"] for j in stored] == ["my-run"]
    job_id = stored[0]["id"]
    assert f"submitted job {job_id} my-run" in result.output
    for command in (
        f"flightdeck watch {job_id}",
        f"flightdeck logs {job_id} --follow",
        f"flightdeck cancel {job_id}",
    ):
        assert command in result.output
    # The local table shows the same findings the service stored, code by code.
    for finding in service.user.get(f"/jobs/{job_id}").json()["findings"]:
        assert finding["code"] in result.output


def test_submit_reads_a_yaml_recipe_as_yaml_1_2_and_sends_the_service_json(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    # As YAML configs are written: comments, flow and block style, a run named by its date (a date to
    # YAML), and three values YAML 1.1 (PyYAML) would change: a Slurm time (the number 14400), a rate
    # without a dot (a string) and `off` (false).
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "# a tiny run\n"
        "name: 2026-11-29\n"
        "model: {path: models/tiny-llama}\n"
        "data:\n"
        "  train:\n"
        "    - path: data/a.jsonl\n"
        "      preset: alpaca\n"
        "training:\n"
        "  learning_rate: 2e-4\n"
        "  max_steps: 3\n"
        "resources:\n"
        "  accelerator: any\n"
        "  slurm: {time: 04:00:00}\n"
        "env:\n"
        "  WANDB_MODE: off\n"
    )
    result = run(runner, service, "submit", str(path))
    assert result.exit_code == 0, result.output
    (job,) = service.user.get("/jobs").json()["data"]
    assert service.user.get(f"/jobs/{job['id']}").json()["recipe"] == {
        "name": "2026-11-29",
        "model": {"path": "models/tiny-llama"},
        "data": {"train": [{"path": "data/a.jsonl", "preset": "alpaca"}]},
        "training": {"learning_rate": 0.0002, "max_steps": 3},
        "resources": {"accelerator": "any", "slurm": {"time": "04:00:00"}},
        "env": {"WANDB_MODE": "off"},
    }

    # An Axolotl config as it is: its keys named with the recipe's places, nothing submitted.
    path.write_text(
        "base_model: models/tiny-llama\nadapter: qlora\nlearning_rate: 2e-4\ntrain_on_inputs: false\n"
    )
    result = run(runner, service, "submit", str(path))
    assert result.exit_code == 2
    assert "'learning_rate' belongs in 'training'" in result.output
    assert '"quantization": "4bit"' in result.output
    assert "train_on_inputs false" in result.output and "did you mean" not in result.output
    # A key given twice is an error (JSON would keep the last), with where it is.
    path.write_text("name: a\nname: b\n")
    result = run(runner, service, "submit", str(path))
    assert result.exit_code == 2
    assert 'not valid YAML: found duplicate key "name"' in result.output and "line 2" in result.output
    assert service.user.get("/jobs").json()["count"] == 1


def test_submit_refuses_a_bad_recipe_before_any_network_call(runner: CliRunner, tmp_path: Path) -> None:
    bad = minimal_recipe(training={"learning_rate": -1}, surprise=True)
    # The URL points nowhere: a request would fail with 'cannot reach', not list the findings.
    result = runner.invoke(
        app, ["submit", str(recipe_file(tmp_path, bad)), "--url", closed_port_url(), "--token", "x"]
    )

    assert result.exit_code == 2
    assert "surprise" in result.output
    assert "training.learning_rate" in result.output
    assert "nothing was submitted" in result.output
    assert "cannot reach" not in result.output


def test_submit_without_service_tables_uses_schema_and_static_rules(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker image has no SQLModel: importing flightdeck.service.jobs fails there.
    monkeypatch.setitem(sys.modules, "flightdeck.service.jobs", None)
    result = runner.invoke(
        app, ["submit", str(recipe_file(tmp_path, minimal_recipe(surprise=1))), "--url", closed_port_url()]
    )
    assert result.exit_code == 2
    assert "surprise" in result.output


def test_unreadable_recipe_unreachable_service_and_wrong_token_are_clear_errors(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": ')
    result = runner.invoke(app, ["submit", str(broken), "--url", service.url, "--token", USER_TOKEN])
    assert result.exit_code == 2 and "not valid JSON" in result.output

    result = runner.invoke(app, ["jobs", "--url", closed_port_url(), "--token", USER_TOKEN])
    assert result.exit_code == 2
    assert "cannot reach the Flightdeck service" in result.output and "FLIGHTDECK_URL" in result.output

    result = runner.invoke(app, ["jobs", "--url", service.url, "--token", "wrong"])
    assert result.exit_code == 2
    assert "refused the token" in result.output and "FLIGHTDECK_TOKEN" in result.output

    result = runner.invoke(app, ["jobs", "--url", service.url, "--token", WORKER_TOKEN])
    assert result.exit_code == 2 and "user token" in result.output

    result = runner.invoke(app, ["jobs", "--url", service.url])
    assert result.exit_code == 2 and "no token" in result.output

    result = run(runner, service, "jobs", "--status", "bogus")
    assert result.exit_code == 2 and "use one of queued, running" in result.output


def test_url_and_token_come_from_the_environment(runner: CliRunner, service: LiveService) -> None:
    service.submit(minimal_recipe("from-env"))
    result = runner.invoke(app, ["jobs"], env={"FLIGHTDECK_URL": service.url, "FLIGHTDECK_TOKEN": USER_TOKEN})
    assert result.exit_code == 0, result.output
    assert "from-env" in result.output


def test_jobs_show_cancel_and_status_filter(runner: CliRunner, service: LiveService) -> None:
    hostile = 'x[bold]y</td><script>alert("1")</script>'
    running_id, attempt_id = service.start_job(minimal_recipe("runs"))
    service.metrics(attempt_id, range(3))
    queued_id = service.submit(minimal_recipe(hostile))

    listed = run(runner, service, "jobs")
    assert listed.exit_code == 0, listed.output
    assert hostile in listed.output  # printed as text, not read as rich markup
    assert "cpu-1" in listed.output

    shown = run(runner, service, "show", str(running_id))
    assert shown.exit_code == 0, shown.output
    assert "launch plan" in shown.output and "torchrun" in shown.output
    assert "attempts" in shown.output
    plan = service.job(running_id)["attempts"][0]["plan"]
    assert plan["env"] and plan["env"][0]["name"] in shown.output
    assert f"run directory {plan['run_dir']}" in shown.output  # where the files are, under the database's id

    cancelled = run(runner, service, "cancel", str(queued_id))
    assert cancelled.exit_code == 0, cancelled.output
    assert f"job {queued_id} cancelled" in cancelled.output
    again = run(runner, service, "cancel", str(queued_id))
    assert again.exit_code == 2 and "terminal" in again.output

    stopping = run(runner, service, "cancel", str(running_id))
    assert f"job {running_id} cancelling" in stopping.output

    only = run(runner, service, "jobs", "--status", "cancelled")
    assert hostile in only.output and "runs" not in only.output

    missing = run(runner, service, "show", "999")
    assert missing.exit_code == 2 and "no job 999" in missing.output


def test_show_prints_a_deep_run_directory_on_one_line_to_be_copied(
    runner: CliRunner, service: LiveService
) -> None:
    job_id = service.submit(minimal_recipe("deep"))
    deep = "/srv/" + "/".join(["shared-storage"] * 6) + "/runs"
    attempt = service.claim(service.register_worker("deep-1", runs_dir=deep))
    run_dir = attempt["plan"]["run_dir"]
    assert attempt["job_id"] == job_id and len(run_dir) > 100  # wider than the 80-column console
    shown = runner.invoke(
        app, ["show", str(job_id), "--url", service.url, "--token", USER_TOKEN], env={"COLUMNS": "80"}
    )
    assert shown.exit_code == 0, shown.output
    assert f"run directory {run_dir}\n" in shown.output, shown.output


def _finish_later(service: LiveService, attempt_id: int, delay: float, **report: Any) -> threading.Thread:
    def finish() -> None:
        time.sleep(delay)
        service.metrics(attempt_id, range(5, 8))
        service.finish(attempt_id, **report)

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def test_watch_exits_0_when_the_job_succeeds(runner: CliRunner, service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    service.metrics(attempt_id, range(5))
    # An output path wider than the console: printed on one line, to be copied whole.
    output = "/srv/" + "/".join(["shared-storage"] * 6) + "/runs/x/job-1-attempt-1/output/stage-0"
    thread = _finish_later(service, attempt_id, 1.0, status="succeeded", exit_code=0, output_path=output)

    result = runner.invoke(
        app,
        ["watch", str(job_id), "--interval", "0.2", "--url", service.url, "--token", USER_TOKEN],
        env={"COLUMNS": "80"},
    )
    thread.join()

    assert result.exit_code == 0, result.output
    assert f"job {job_id} succeeded; output: {output}\n" in result.output, result.output
    assert "loss" in result.output and "grad_norm" in result.output


def test_watch_exits_1_and_prints_the_failure(runner: CliRunner, service: LiveService) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    thread = _finish_later(
        service,
        attempt_id,
        0.5,
        status="failed",
        exit_code=42,
        failure_class="health:G002",
        failure_code="G002",
        message="adapter gradients are zero",
        fix="enable input require grads",
    )
    result = run(runner, service, "watch", str(job_id), "--interval", "0.2")
    thread.join()

    assert result.exit_code == 1, result.output
    for text in ("failed", "G002", "adapter gradients are zero", "enable input require grads"):
        assert text in result.output


def test_watch_exits_1_on_cancelled(runner: CliRunner, service: LiveService) -> None:
    job_id = service.submit(minimal_recipe())
    service.user.post(f"/jobs/{job_id}/cancel")
    result = run(runner, service, "watch", str(job_id))
    assert result.exit_code == 1 and "cancelled" in result.output


def test_logs_prints_the_log_and_follow_streams_until_the_end(
    runner: CliRunner, service: LiveService
) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe())
    offset = service.log(attempt_id, 0, "first line\n")

    printed = run(runner, service, "logs", str(job_id))
    assert printed.exit_code == 0 and printed.output == "first line\n"

    def more() -> None:
        time.sleep(0.8)
        end = service.log(attempt_id, offset, "second line\n")
        service.log(attempt_id, end, "last line\n")
        service.finish(attempt_id, status="succeeded", exit_code=0)

    thread = threading.Thread(target=more)
    thread.start()
    followed = run(runner, service, "logs", str(job_id), "--follow")
    thread.join()

    assert followed.exit_code == 0, followed.output
    assert "first line\nsecond line\nlast line\n" in followed.output
    assert f"job {job_id} succeeded" in followed.output


def test_workers_lists_registered_workers(runner: CliRunner, service: LiveService) -> None:
    service.start_job(minimal_recipe(), worker="gpu-box-7")
    result = run(runner, service, "workers")
    assert result.exit_code == 0, result.output
    assert "gpu-box-7" in result.output and "cpu x 2" in result.output and "yes" in result.output


def test_preflight_prints_findings_memory_and_plan(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    recipe = recipe_file(tmp_path, minimal_recipe())
    result = run(runner, service, "preflight", str(recipe))
    assert result.exit_code == 0, result.output
    # No workspace here holds the recipe's paths: the worker's checks are named as not run, no "passed".
    assert "static checks passed" in result.output and "not run here" in result.output, result.output
    assert "memory estimate: unknown" in result.output

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA2_7B))
    host = tmp_path / "host.json"
    host.write_text(
        json.dumps({"hostname": "h", "cpu_slots": 2, "cores": 4, "workspace": "/ws", "runs_dir": "/r"})
    )
    result = run(
        runner, service, "preflight", str(recipe), "--model-config", str(config), "--host", str(host)
    )
    assert result.exit_code == 0, result.output
    assert "memory estimate per GPU (GB)" in result.output
    assert "weights" in result.output and "total" in result.output
    assert "launch plan" in result.output and "flightdeck.worker.train" in result.output

    refused = run(runner, service, "preflight", str(recipe_file(tmp_path, minimal_recipe(surprise=1))))
    assert refused.exit_code == 2 and "surprise" in refused.output


def test_submit_watch_follows_the_job_to_its_end(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    def run_the_job() -> None:
        time.sleep(0.5)
        attempt = service.claim(service.register_worker())
        service.metrics(attempt["id"], range(4))
        service.finish(attempt["id"], status="succeeded", exit_code=0)

    thread = threading.Thread(target=run_the_job)
    thread.start()
    result = run(runner, service, "submit", str(recipe_file(tmp_path, minimal_recipe())), "--watch")
    thread.join()
    assert result.exit_code == 0, result.output
    assert "submitted job 1" in result.output and "job 1 succeeded" in result.output


def test_the_cli_imports_without_fastapi_or_sqlmodel() -> None:
    code = (
        "import sys; import flightdeck.cli.main; "
        "bad = [m for m in ('fastapi', 'sqlmodel', 'sqlalchemy', 'starlette', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_preflight_of_a_script_job_shows_its_launch_plan_and_the_rules_that_could_run(
    runner: CliRunner, service: LiveService, tmp_path: Path
) -> None:
    job = json.loads(
        (Path(__file__).resolve().parents[2] / "examples/own-script/plain-loop-job.json").read_text()
    )
    result = run(runner, service, "preflight", str(recipe_file(tmp_path, job)))
    assert result.exit_code == 0, result.output
    assert "launch plan on a notional worker" in result.output
    # {workspace} in the args is filled in with the (notional) worker's workspace.
    assert re.search(r"examples/own-script/plain_loop\.py --model \S*/models/tiny-llama", result.output)
    assert "E004" in result.output and "FLIGHTDECK_RUN_DIR" in result.output
    assert "does not declare model, data, training" in result.output


def test_workers_shows_whether_each_worker_runs_scripts(runner: CliRunner, service: LiveService) -> None:
    inventory = {"hostname": "h", "cpu_slots": 2, "cores": 2, "workspace": "/ws", "runs_dir": "/r"}
    for name, scripts in (("careful-box", False), ("open-box", True)):
        body = {"name": name, "inventory": inventory | {"runs_scripts": scripts}}
        assert service.enrol.post("/workers", json=body).status_code == 201
    result = run(runner, service, "workers")
    assert result.exit_code == 0, result.output
    cells = [
        [c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "-box" in line
    ]
    header = [
        c.strip() for c in next(line for line in result.output.splitlines() if "scripts" in line).split("┃")
    ]
    column = header.index("scripts") - 1
    assert {row[1]: row[column] for row in cells} == {"careful-box": "no", "open-box": "yes"}, result.output


def test_watch_without_a_terminal_prints_progress_lines_with_the_steps_of_every_stage(
    runner: CliRunner, service: LiveService
) -> None:
    two_stage = minimal_recipe() | {
        "stages": [{"training": {"max_steps": 10}}, {"training": {"max_steps": 10}}]
    }
    job_id, attempt_id = service.start_job(two_stage)
    service.metrics(attempt_id, range(1, 13))
    thread = _finish_later(service, attempt_id, 1.0, status="succeeded", exit_code=0, output_path="/ws/out")
    result = run(runner, service, "watch", str(job_id), "--interval", "0.2")
    thread.join()
    assert result.exit_code == 0, result.output
    # CliRunner is no terminal: a plain line per change, the total over both stages (not "12/10").
    assert f"job {job_id} running  step 12/20" in result.output, result.output
    assert f"job {job_id} succeeded  step 12/20  loss" in result.output, result.output


def test_watch_of_a_finished_job_prints_its_last_step_not_step_0(
    runner: CliRunner, service: LiveService
) -> None:
    job_id, attempt_id = service.start_job(minimal_recipe() | {"training": {"max_steps": 30}})
    service.metrics(attempt_id, range(1, 31))
    service.finish(attempt_id, status="succeeded", exit_code=0, output_path="/ws/out")
    listed = run(runner, service, "jobs")
    assert re.search(rf"{job_id} │ succeeded .*│ +30 │", listed.output), listed.output
    result = run(runner, service, "watch", str(job_id))
    assert result.exit_code == 0, result.output
    assert f"job {job_id} succeeded  step 30/30" in result.output, result.output
    assert "step 0/" not in result.output, result.output


def test_a_queued_job_says_why_it_waits_and_attempts_name_their_worker(
    runner: CliRunner, service: LiveService
) -> None:
    gpu_job = service.submit(minimal_recipe() | {"resources": {"gpus_per_node": 8, "accelerator": "gpu"}})
    service.start_job(minimal_recipe(), worker="box-with-a-name")
    shown = run(runner, service, "show", str(gpu_job))
    assert shown.exit_code == 0, shown.output
    assert "waiting:" in shown.output and "no live worker fits" in shown.output and "gpu x 8" in shown.output
    started = next(j for j in service.user.get("/jobs").json()["data"] if j["status"] == "running")
    assert "box-with-a-name" in run(runner, service, "show", str(started["id"])).output.split("attempts")[-1]


def test_findings_without_a_catalog_code_say_where_they_come_from(runner: CliRunner, tmp_path: Path) -> None:
    bad = recipe_file(tmp_path, minimal_recipe(training={"learning_rate": -1}))
    result = runner.invoke(app, ["submit", str(bad), "--url", closed_port_url(), "--token", "x"])
    assert result.exit_code == 2
    row = next(line for line in result.output.splitlines() if "training.learning_rate" in line)
    assert "schema" in row, result.output


def test_show_lists_the_nodes_of_a_multi_node_attempt_and_logs_reads_each_node(
    runner: CliRunner, service: LiveService
) -> None:
    recipe = minimal_recipe("gang", resources={"nodes": 2, "gpus_per_node": 1, "accelerator": "cpu"})
    job_id, attempt_id, nodes = service.start_gang(recipe, ("node-a", "node-b"))
    for rank, client in enumerate(nodes):
        text = f"hello from node {rank}\n"
        chunk = {"offset": 0, "text": text, "length": len(text)}
        assert client.post(f"/attempts/{attempt_id}/logs", json=chunk).status_code == 200
    shown = run(runner, service, "show", str(job_id))
    assert shown.exit_code == 0, shown.output
    assert "nodes of attempt 1" in shown.output
    rows = [line for line in shown.output.splitlines() if "node-a" in line or "node-b" in line]
    assert any("node-a" in r and "running" in r for r in rows) and any("node-b" in r for r in rows)
    assert run(runner, service, "logs", str(job_id), "--node", "1").output == "hello from node 1\n"
    assert run(runner, service, "logs", str(job_id)).output == "hello from node 0\n"


def test_show_prints_what_the_latest_attempts_host_preflight_resolved(
    runner: CliRunner, service: LiveService
) -> None:
    from flightdeck.recipe.findings import Finding
    from flightdeck.worker.agent.host_check import HostCheck

    prefixes = [r"^model\.visual\.(?!merger\.)"]
    resolved = Finding(
        severity="fix",
        path="model.freeze",
        message="vision_tower resolved for this qwen2_vl model.",
        fix=f"model.freeze set to {prefixes}",
        value=prefixes,
        where="host",
    )
    job_id, attempt_id = service.start_job(
        minimal_recipe("vl", model={"path": "models/vl", "freeze": ["vision_tower"]})
    )
    # The events the agent sends before launch (worker/agent/attempt.py), through the worker API.
    events = HostCheck(findings=[resolved.model_dump(mode="json")]).events()
    answer = service.worker.post(f"/attempts/{attempt_id}/events", json={"events": events})
    assert answer.status_code == 200, answer.text
    assert service.job(job_id)["effective_recipe"]["model"]["freeze"] == ["vision_tower"]  # the job's own

    shown = run(runner, service, "show", str(job_id))
    assert shown.exit_code == 0, shown.output
    assert "host preflight fixes (attempt 1 on cpu-1)" in shown.output
    row = next(line for line in shown.output.splitlines() if "model.freeze" in line and "│" in line)
    assert json.dumps(prefixes) in row  # the module prefixes as a recipe would spell them


def test_show_says_what_slurm_last_said_of_the_latest_attempt(
    runner: CliRunner, service: LiveService
) -> None:
    from flightdeck.contracts import attempt_event

    job_id, attempt_id = service.start_job(minimal_recipe("on-slurm"))
    # The events the Slurm executor sends as Slurm's state changes (worker/slurm/executor.py).
    events = [
        attempt_event("slurm:job", "slurm", "Slurm job 12 submitted", data={"slurm_job_id": "12"}),
        attempt_event(
            "slurm:pending",
            "slurm",
            "Slurm job 12: PENDING (Resources)",
            data={"slurm_job_id": "12", "state": "PENDING", "reason": "Resources", "nodes": ""},
        ),
    ]
    answer = service.worker.post(f"/attempts/{attempt_id}/events", json={"events": events})
    assert answer.status_code == 200, answer.text
    shown = run(runner, service, "show", str(job_id))
    assert shown.exit_code == 0, shown.output
    assert "slurm: Slurm job 12: PENDING (Resources)" in shown.output
