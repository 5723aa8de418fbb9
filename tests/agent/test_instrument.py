"""A script job watched with no edit: the plan's environment, the autoload hooks in a real rank, the end
marker, and the agent's side of a hang in teardown (H008). The scripts are users' (tests/agent/user_scripts)."""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flightdeck.inventory import WorkerInventory
from flightdeck.launch.plan import build_launch_plan
from flightdeck.recipe import parse_recipe
from flightdeck.worker.agent.environment import launch_environment
from flightdeck.worker.agent.log_metrics import fill_metrics_from_log, parse_trainer_log
from flightdeck.worker.agent.teardown import TeardownWatch, TrainerEndInLog, innermost_frames, live_ranks
from flightdeck.worker.instrument import AUTOLOAD_DIR, script_end
from flightdeck.worker.instrument.hooks import after_import
from flightdeck.worker.train.metrics_file import read_metrics

from .processes import free_tcp_port

USER_SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
CPU = WorkerInventory(cpu_slots=2, cores=2, workspace="/srv/ws", runs_dir="/srv/runs")


def _plan(entrypoint: dict[str, Any], workspace: str = "/srv/ws", **recipe: Any) -> Any:
    inventory = CPU.model_copy(update={"workspace": workspace})
    parsed = parse_recipe(
        {"name": "s", "entrypoint": entrypoint, "resources": {"accelerator": "cpu"}, **recipe}
    )
    return build_launch_plan(parsed, inventory, job_id=7, database="db", attempt_number=2, devices=None)


def test_a_script_jobs_plan_instruments_it_and_fills_the_attempts_directories_into_its_args() -> None:
    plan = _plan(
        {"script": "train.py", "args": ["--out", "{output_dir}/ckpt", "--data={workspace}/d", "{x}"]}
    )
    assert plan.argv[-5:] == [
        "/srv/ws/train.py",
        "--out",
        "/srv/runs/db/job-7-attempt-2/output/ckpt",
        "--data=/srv/ws/d",
        "{x}",
    ]
    assert plan.argv[-1] == "{x}"  # a brace of the script's own is kept
    assert plan.env_value("FLIGHTDECK_INSTRUMENT") == "1"
    (path,) = [v for v in plan.env if v.name == "PYTHONPATH"]
    assert path.value is None and "sitecustomize" in path.reason
    env, _ = launch_environment(plan, {"PYTHONPATH": "/home/u/lib"}, port=29500)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(AUTOLOAD_DIR), "/srv/ws", "/home/u/lib"]


def test_an_uninstrumented_script_job_gets_a_bare_launch() -> None:
    plan = _plan({"module": "team.train", "instrument": False})
    assert plan.env_value("FLIGHTDECK_INSTRUMENT") is None
    env, _ = launch_environment(plan, {}, port=29500)
    assert env["PYTHONPATH"] == "/srv/ws"  # the module imports although the run's directory is the cwd
    recipe_plan = build_launch_plan(
        parse_recipe(
            {
                "name": "r",
                "model": {"path": "m"},
                "data": {"train": [{"path": "d.jsonl"}]},
                "resources": {"accelerator": "cpu"},
            }
        ),
        CPU,
        job_id=1,
        database="db",
        attempt_number=1,
        devices=None,
    )
    assert "PYTHONPATH" not in launch_environment(recipe_plan, {}, port=29500)[0]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from flightdeck.worker.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


def _rank_env(plan: Any, run_dir: Path) -> dict[str, str]:
    """The environment torchrun gives rank 0 of 1, over the agent's launch environment for the plan."""
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env, _ = launch_environment(plan, inherited, port=29500)  # the rank's own port is set below
    env.update(
        FLIGHTDECK_RUN_DIR=str(run_dir),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_tcp_port()),
    )
    return env


def _start_script(
    tmp_path: Path, name: str, script: str, args: list[str]
) -> tuple[subprocess.Popen[str], Path]:
    run_dir = tmp_path / name
    run_dir.mkdir()
    plan = _plan({"script": script, "args": args}, workspace=str(USER_SCRIPTS))
    proc = subprocess.Popen(
        [sys.executable, str(USER_SCRIPTS / script), *args],
        env=_rank_env(plan, run_dir),
        cwd=run_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, run_dir


def _finish(started: tuple[subprocess.Popen[str], Path]) -> tuple[int, Path, str]:
    proc, run_dir = started
    log = proc.communicate(timeout=180)[0]
    return proc.returncode, run_dir, log


def _run_script(tmp_path: Path, name: str, script: str, args: list[str]) -> tuple[int, Path, str]:
    return _finish(_start_script(tmp_path, name, script, args))


def _run_as_rank(code: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python -c code` as an instrumented script job's only rank, with run_dir as its run directory."""
    plan = _plan({"script": "train.py"}, workspace=str(run_dir))
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_rank_env(plan, run_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # two real ranks
def test_a_plain_loop_is_watched_at_its_optimizer_steps_and_its_zero_loss_stops_with_d005(
    tmp_path: Path,
) -> None:
    healthy = _start_script(tmp_path, "ok", "ddp_loop.py", ["--total_epochs", "1", "--samples", "48"])
    zero = _start_script(tmp_path, "zero", "ddp_loop.py", ["--zero_loss", "--samples", "48"])
    code, run_dir, log = _finish(healthy)
    assert code == 0, log
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))  # 48 samples / batch 8
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["learning_rate"] == 0.01 for r in steps), steps
    assert records[0]["data"]["source"] == "optimizer_hook"
    assert json.loads((run_dir / "script-end-rank0.json").read_text())["rank"] == 0
    assert (run_dir / "snapshot.pt").is_file()  # relative paths land in the attempt's directory

    code, run_dir, log = _finish(zero)
    assert code == 42, log
    result = json.loads((run_dir / "result.json").read_text())
    assert result["failure_code"] == "D005", result
    assert max(r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "step") == 2
    assert not (run_dir / "script-end-rank0.json").exists()  # a stopped script did not end


@pytest.mark.slow  # a tiny model built and trained: the TRL end-to-end test covers the default path too
def test_an_hf_trainer_script_gets_the_callback_with_no_edit(tmp_path: Path, tiny_llama: Path) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"{i} plus 1?", "answer": str(i + 1)}) + "\n" for i in range(16))
    )
    args = [
        "--model_name_or_path", str(tiny_llama), "--train_file", str(data), "--output_dir", "out",
        "--max_steps", "3", "--logging_steps", "1", "--per_device_train_batch_size", "2", "--use_cpu",
        "--report_to", "none", "--disable_tqdm", "true", "--save_strategy", "no",
    ]  # fmt: skip
    code, run_dir, log = _run_script(tmp_path, "hf", "train_qa.py", args)
    assert code == 0, log
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]
    started = [r for r in records if r["type"] == "event" and r["message"].startswith("training started")]
    assert (
        len(started) == 1 and "optimizer" not in started[0]["message"]
    )  # the callback's, the loop watch stood down
    assert json.loads((run_dir / "result.json").read_text())["status"] == "succeeded"

    # The last resort, on this real Trainer's log: its own logged-step lines, parsed, marked as parsed.
    logged = [r["loss"] for r in records if r["type"] == "step"]
    assert [r["loss"] for r in parse_trainer_log(log)] == pytest.approx(logged, rel=1e-3)
    bare = tmp_path / "bare-run"
    bare.mkdir()
    (bare / "output.log").write_text(log)
    assert fill_metrics_from_log(bare) == 3 and fill_metrics_from_log(bare) == 0  # once: then it has steps
    parsed = [r for r in read_metrics(bare / "metrics.jsonl") if r["type"] == "step"]
    assert [(r["step"], r["parsed_from_log"]) for r in parsed] == [(1, 1), (2, 1), (3, 1)]
    assert fill_metrics_from_log(run_dir) == 0  # the callback reported: nothing parsed


@pytest.mark.slow  # builds an HF Trainer in a subprocess
def test_a_trainer_given_the_callback_by_the_script_gets_it_once() -> None:
    from flightdeck.worker.callback import FlightdeckCallback
    from flightdeck.worker.instrument.trainer_patch import with_callback

    own = FlightdeckCallback()
    assert with_callback([own]) == [own]
    assert with_callback([FlightdeckCallback]) == [FlightdeckCallback]
    (added,) = with_callback(None)
    assert isinstance(added, FlightdeckCallback)


def test_an_after_import_action_runs_once_and_the_module_keeps_its_own_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "team_model.py").write_text("def forward():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    finder = after_import({"team_model": lambda module: seen.append(module.__name__)})
    try:
        import importlib
        import inspect

        module = importlib.import_module("team_model")
        assert seen == ["team_model"]
        assert "return 1" in inspect.getsource(module.forward)  # source lookups go to the real loader
        assert type(module.__loader__).__name__ == "SourceFileLoader"
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("team_model", None)


def test_the_end_of_every_rank_starts_the_teardown_grace(tmp_path: Path) -> None:
    now = [100.0]
    watch = TeardownWatch(tmp_path, ranks=2, grace=30, clock=lambda: now[0])
    (tmp_path / "script-end-rank0.json").write_text("{}")
    assert not watch.ended_now() and not watch.overdue()  # rank 1 still training
    (tmp_path / "script-end-rank1.json").write_text("{}")
    assert watch.ended_now() and not watch.ended_now()  # said once
    now[0] = 129.0
    assert not watch.overdue()
    now[0] = 130.0
    assert watch.overdue()


def test_a_rank_inside_destroy_process_group_counts_as_ended_until_the_call_returns(tmp_path: Path) -> None:
    """torch's destroy_process_group() can hang when the ranks leave apart (pytorch/pytorch#75097): a
    rank inside it has finished training, so its hang is teardown (H008), not a stall with no end."""
    now = [100.0]
    watch = TeardownWatch(tmp_path, ranks=2, grace=30, clock=lambda: now[0])
    (tmp_path / "script-end-rank0.json").write_text("{}")
    (tmp_path / "leaving-rank1.json").write_text("{}")
    assert watch.ended_now()
    now[0] = 110.0
    # Its call returned and the script goes on (a save after leaving the group): the grace starts over.
    (tmp_path / "leaving-rank1.json").unlink()
    assert not watch.overdue()
    now[0] = 200.0
    assert not watch.overdue() and not watch.ended_now()
    (tmp_path / "script-end-rank1.json").write_text("{}")
    assert not watch.ended_now()  # the event was sent once already; the grace restarts now
    now[0] = 229.0
    assert not watch.overdue()
    now[0] = 230.0
    assert watch.overdue()


def test_the_leaving_marker_is_there_exactly_while_the_default_group_is_destroyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    seen: list[tuple[object, bool]] = []

    def destroy(group: object = None) -> None:
        seen.append((group, (tmp_path / "leaving-rank3.json").exists()))

    wrapped = script_end.leaving_marked(destroy)
    assert script_end.leaving_marked(wrapped) is wrapped  # wrapped once however often installed
    wrapped()
    wrapped("a subgroup")  # destroying a subgroup is not leaving
    assert seen == [(None, True), ("a subgroup", False)]
    assert not list(tmp_path.iterdir())


def test_the_recipe_trainers_rank_is_marked_leaving_while_it_destroys_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real gloo group of one, torn down by the recipe trainer's cleanup: NCCL's destroy can hang when
    the ranks leave apart, and the agent must read a rank inside it as done training (H008)."""
    import torch.distributed as dist

    from flightdeck.worker.train.recipe_run import RecipeRun

    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    real_destroy = dist.destroy_process_group
    seen: list[bool] = []

    def destroy(group: object = None) -> None:
        seen.append((tmp_path / "leaving-rank1.json").exists())
        real_destroy(group)

    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    RecipeRun(tmp_path / "recipe.json").cleanup()
    assert seen == [True] and not dist.is_initialized()
    assert not list(tmp_path.glob("leaving-*"))  # the call returned: no longer leaving


def test_an_instrumented_rank_gets_the_leaving_watch_on_torch_distributed(tmp_path: Path) -> None:
    """A real gloo group of one, under the instrumentation's start-up: dist.destroy_process_group (and
    its home module's) is the watched one, a call that returns leaves no marker behind, and the group
    it destroyed lives on until the interpreter's exit."""
    code = (
        "import torch.distributed as dist, torch.distributed.distributed_c10d as home\n"
        "assert dist.destroy_process_group.flightdeck_leaving, 'not watched'\n"
        "assert home.destroy_process_group is dist.destroy_process_group\n"
        "store = dist.HashStore()\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
        "group = dist.group.WORLD\n"
        "dist.destroy_process_group()\n"
        "from flightdeck.worker.instrument import script_end\n"
        # Kept past the call: its destructor must not run inside the script (a DDP Reducer's last
        # reference, dropped as main() returns, deadlocks gloo's worker threads against the GIL).
        "assert any(kept is group for kept in script_end.KEPT_GROUPS), script_end.KEPT_GROUPS\n"
    )
    done = _run_as_rank(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("*rank*.json")) == ["script-end-rank0.json"]


def test_the_live_rank_and_where_it_waits_are_named(tmp_path: Path) -> None:
    import psutil

    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "FLIGHTDECK_INSTRUMENT": "1"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        found = live_ranks([psutil.Process(rank.pid), psutil.Process(other.pid)])
        assert found == [(1, rank.pid)]
    finally:
        rank.kill()
        other.kill()
    with open(tmp_path / "dump.txt", "w") as out:
        faulthandler.dump_traceback(out, all_threads=True)
    frames = innermost_frames("step 20\n" + (tmp_path / "dump.txt").read_text())
    assert frames and frames[0].startswith("test_instrument.py:")


def test_only_a_script_that_returned_normally_marks_its_end(tmp_path: Path) -> None:
    endings = {
        "returned": "print('done')",
        "raised": "raise ValueError('bad batch')",
        "exit-1": "import sys; sys.exit(1)",
    }
    plan = _plan({"script": "train.py"}, workspace=str(tmp_path))
    started = {}
    for name, code in endings.items():
        (tmp_path / name).mkdir()
        env = _rank_env(plan, tmp_path / name)
        started[name] = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    for proc in started.values():
        proc.wait(timeout=120)
    marked = sorted(name for name in endings if (tmp_path / name / "script-end-rank0.json").exists())
    assert marked == ["returned"]


def test_a_watched_plain_loop_loads_nothing_of_transformers(tmp_path: Path) -> None:
    """The watch's first step loads the health checks and the metrics file, not transformers' trainer:
    with peft and bitsandbytes that was about 7 s per rank at a plain loop's first step here
    (bench/README.md "First step"), for a script that never asked for transformers."""
    loop = (
        "import sys, torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "print(sorted(m for m in ('transformers', 'peft', 'bitsandbytes') if m in sys.modules))\n"
    )
    done = _run_as_rank(loop, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]  # the watch did run
    assert records[0]["data"]["source"] == "optimizer_hook"


@pytest.mark.slow  # the rank imports torch and trains 30 steps
def test_a_quick_loops_last_steps_are_written_when_its_script_ends_even_by_raising(tmp_path: Path) -> None:
    """Millisecond steps wait to be written in batches: whatever the batch holds when the script's main
    code ends reaches metrics.jsonl (threading's exit callbacks run whether it returned or raised)."""
    loop = (
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for _ in range(30):\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "raise ValueError('bad batch')\n"
    )
    done = _run_as_rank(loop, tmp_path)
    assert done.returncode == 1 and "bad batch" in done.stderr, done.stderr
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["type"] == "step"]
    assert steps == list(range(1, 31))


@pytest.mark.slow  # a tiny model built and trained
def test_a_loop_that_reports_through_loop_monitor_is_not_watched_twice(
    tmp_path: Path, tiny_llama: Path
) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "own-script"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = _plan({"script": "plain_loop.py"}, workspace=str(examples))
    proc = subprocess.run(
        [sys.executable, str(examples / "plain_loop.py"), "--model", str(tiny_llama), "--max-steps", "4"],
        env=_rank_env(plan, run_dir),
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3, 4]  # LoopMonitor's, once each
    started = [r for r in records if r["type"] == "event" and r["message"].startswith("training started")]
    assert len(started) == 1 and "optimizer" not in started[0]["message"]


@pytest.mark.slow  # 16 s: 12 rounds of a 2-rank gloo group (bare, it hangs within them)
def test_a_group_destroyed_before_its_ddp_model_is_dropped_does_not_deadlock_an_instrumented_rank(
    tmp_path: Path,
) -> None:
    """torch's ProcessGroupGloo destructor joins its threads holding the GIL; run by a DDP Reducer's last
    reference right after a collective, it deadlocks against a thread releasing that collective's tensors
    (TRL's sft.py hung so after trainer.end(); bare, this script hangs within its first 10 cycles). Under
    the instrumentation a destroyed group lives until the interpreter's exit: 12 cycles end."""
    plan = _plan({"script": "ddp_cycles.py"}, workspace=str(tmp_path))
    env = _rank_env(plan, tmp_path)
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(variable)  # torchrun's to set
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    argv += ["--master_port", env["MASTER_PORT"], str(USER_SCRIPTS / "ddp_cycles.py"), "12", str(tmp_path)]
    import psutil

    launched = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = launched.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        for process in [*psutil.Process(launched.pid).children(recursive=True), launched]:
            process.kill()  # the ranks run in sessions of their own: each one, not torchrun's group
        raise AssertionError(f"the ranks hung:\n{launched.communicate()[0][-3000:]}") from None
    assert launched.returncode == 0, output[-3000:]
    assert [(tmp_path / f"cycles-rank{rank}.txt").read_text() for rank in (0, 1)] == ["12", "12"]


def test_a_rank_left_behind_idle_after_another_ranks_script_ended_counts_as_ended(tmp_path: Path) -> None:
    """A rank can hang inside its script as its main function returns (a destructor holding the GIL):
    no marker comes. Once another rank's script ended, a rank without one that uses next to no CPU for
    the grace counts as ended, the grace counted from when it went idle; one still working does not."""
    now, cpu = [100.0], {0: 5.0, 1: 7.0}
    watch = TeardownWatch(tmp_path, ranks=2, grace=30, clock=lambda: now[0], rank_cpu=lambda: dict(cpu))
    for _ in range(20):  # both training: no rank ended, whatever their CPU
        now[0] += 5.0
        assert not watch.ended_now()
    (tmp_path / "script-end-rank0.json").write_text("{}")
    del cpu[0]
    for _ in range(6):  # rank 1 still working, alone: its CPU grows at half a core
        now[0] += 5.0
        cpu[1] += 2.5
        assert not watch.ended_now() and not watch.overdue()
    went_idle = now[0]
    for _ in range(5):  # idle (a few ms of CPU) for 25 s: not yet
        now[0] += 5.0
        cpu[1] += 0.01
        assert not watch.ended_now()
    now[0] += 5.0
    assert watch.ended_now() and watch.left_behind == [1]
    assert watch.ended_at == went_idle and watch.overdue()


def test_without_the_rank_cpu_a_rank_left_behind_is_never_counted(tmp_path: Path) -> None:
    now = [100.0]
    watch = TeardownWatch(tmp_path, ranks=2, grace=30, clock=lambda: now[0])
    (tmp_path / "script-end-rank0.json").write_text("{}")
    now[0] = 1000.0
    assert not watch.ended_now() and not watch.overdue()


def test_a_bare_runs_rank_that_exits_or_its_trainers_end_line_starts_the_left_behind_watch(
    tmp_path: Path,
) -> None:
    """A bare launch writes no marker. Its end is read from outside: a rank seen alive that exited (its
    script ended; torchrun would have ended all on a failure), or the Trainer's end-of-training line.
    Before either, idle ranks are left alone (a bare run waiting on I/O is not judged)."""
    now, cpu, log = [100.0], {0: 5.0, 1: 7.0}, ["{'loss': '6.1', 'grad_norm': '3.0', 'epoch': '0.1'}\n"]

    def bare_watch() -> TeardownWatch:
        return TeardownWatch(
            tmp_path,
            ranks=2,
            grace=30,
            clock=lambda: now[0],
            rank_cpu=lambda: dict(cpu),
            bare_end=TrainerEndInLog(lambda: "".join(log), clock=lambda: now[0]),
        )

    watch = bare_watch()
    for _ in range(20):  # both idle, nothing says the script ended
        now[0] += 5.0
        assert not watch.ended_now()
    del cpu[0]  # rank 0 exited
    for _ in range(6):
        now[0] += 5.0
        assert not watch.ended_now()
    now[0] += 5.0
    assert watch.ended_now() and watch.left_behind == [1] and watch.exited == [0]

    now[0], cpu = 100.0, {0: 5.0, 1: 7.0}
    watch = bare_watch()
    for _ in range(10):
        now[0] += 5.0
        assert not watch.ended_now()
    log.append("{'train_runtime': '0.7618', 'train_samples_per_second': '42.01', 'epoch': '0.16'}\n")
    log.append("Model saved to output\n")
    for _ in range(6):  # both ranks idle from the line on: the grace runs from the first poll that sees it
        now[0] += 5.0
        assert not watch.ended_now()
    now[0] += 5.0
    assert watch.ended_now() and watch.left_behind == [0, 1] and watch.exited == []


def test_the_trainers_end_line_is_read_at_most_every_few_seconds_and_stays_seen() -> None:
    now, reads, text = [0.0], [0], [""]

    def tail() -> str:
        reads[0] += 1
        return text[0]

    seen = TrainerEndInLog(tail, clock=lambda: now[0])
    assert not seen() and not seen() and reads[0] == 1
    text[0] = '{"train_runtime": 1.5}'
    now[0] = 4.9
    assert not seen()
    now[0] = 5.0
    assert seen() and reads[0] == 2
    text[0] = ""  # the line scrolled out of the tail
    now[0] = 60.0
    assert seen() and reads[0] == 2
