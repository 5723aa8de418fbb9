"""Cold start: what a fresh process pays before a watched plain loop's first step, and before a fresh
agent's first host check (every Slurm attempt's runner is one).

Each measurement is a new `python -c`, so nothing is imported yet:
- `loop`: a plain PyTorch loop (a linear model, SGD) as an instrumented script job's only rank, in the
  environment the agent gives it (the launch plan's variables: the autoload hooks on PYTHONPATH,
  FLIGHTDECK_INSTRUMENT=1, the run directory): seconds from the end of `import torch` to the end of its
  first optimizer step, where the loop watch loads what it judges with. Baseline in the same command:
  `loop-bare`, the same loop as a script job with `entrypoint.instrument` false.
- `loop+trainer-module`: `loop` with transformers' trainer module (`transformers.trainer_callback`,
  which brings peft and bitsandbytes) imported at the first step: what the watch loaded there while
  HealthMonitor subclassed TrainerCallback.
- `host-check`: a fresh process's first host check of the tiny LoRA recipe (`run_host_preflight`, as the
  agent and the Slurm attempt runner call it), from after importing the preflight package.
- `host-check+trainer-module`: the same with transformers' trainer module imported first, inside the
  timed span: what the check loaded while HealthMonitor subclassed TrainerCallback.
- `recipe-rank`: a recipe job's one rank from start to exit (`python -m flightdeck.worker.train`, the
  tiny LoRA recipe, 2 steps, no quantization, no loader workers): the rank keeps bitsandbytes out
  (worker/train/bitsandbytes_gate.py).
- `recipe-rank+bitsandbytes`: the same rank with bitsandbytes imported first, as every rank did before.
Each child also reports which of transformers, peft and bitsandbytes it ended with. Variants alternate
round by round (bench.harness.interleaved).

Usage: python -m bench.cold_start [--reps 5] [--variants loop-bare,loop,...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.harness import (
    RESULTS_DIR,
    Reps,
    ResultsDir,
    Table,
    interleaved,
    ratio,
    run_cli,
    summary,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("transformers", "peft", "bitsandbytes")
VARIANTS = (
    "loop-bare",
    "loop",
    "loop+trainer-module",
    "host-check",
    "host-check+trainer-module",
    "recipe-rank",
    "recipe-rank+bitsandbytes",
)
# Each variant's baseline, measured in the same command.
BASELINE = {
    "loop": "loop-bare",
    "loop+trainer-module": "loop",
    "host-check+trainer-module": "host-check",
    "recipe-rank+bitsandbytes": "recipe-rank",
}

_LOOP = """
import json, sys, time
import torch
started = time.perf_counter()
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    if step == 0 and sys.argv[1] == "trainer-module":
        import transformers.trainer_callback
    model(torch.randn(8, 16)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 0:
        first = time.perf_counter() - started
print(json.dumps({"seconds": first, "loaded": [m for m in %(heavy)r if m in sys.modules]}))
"""

_HOST_CHECK = """
import json, sys, time
from pathlib import Path
from flightdeck.inventory import WorkerInventory
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.host_preflight import run_host_preflight

recipe = Recipe.model_validate(
    {"name": "cold", "model": {"path": "models/tiny-llama"}, "data": {"train": [{"path": "data/qa.jsonl"}]}}
)
started = time.perf_counter()
if sys.argv[1] == "trainer-module":
    import transformers.trainer_callback
run_host_preflight(recipe, WorkerInventory(cpu_slots=1), Path(sys.argv[2]), [], environ={})
print(json.dumps({"seconds": time.perf_counter() - started, "loaded": [m for m in %(heavy)r if m in sys.modules]}))
"""

# The trainer's entry point run as torchrun runs it; bitsandbytes imported first for the "before" variant.
_RECIPE_RANK = """
import runpy, sys
if sys.argv[1] == "bitsandbytes":
    import bitsandbytes
sys.argv[1:] = sys.argv[2:]
runpy.run_module("flightdeck.worker.train", run_name="__main__", alter_sys=True)
"""


def _workspace(directory: Path) -> Path:
    """The tiny llama (save_pretrained) and 40 question-answer rows: what the host check reads."""
    from flightdeck.worker.tiny.model import make_tiny_model

    make_tiny_model(directory / "models" / "tiny-llama")
    rows = [json.dumps({"question": f"q {i}", "answer": f"a {i}"}) for i in range(40)]
    (directory / "data").mkdir()
    (directory / "data" / "qa.jsonl").write_text("\n".join(rows) + "\n")
    return directory


def _recipe_rank(extra: str, workspace: Path, run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Seconds from the rank's start to its exit (it leaves by os._exit, so the parent times it), and what
    it imported (-X importtime's lines on its stderr)."""
    recipe = {
        "name": "cold",
        "model": {"path": "models/tiny-llama"},
        "adapter": {"type": "lora", "target_modules": ["q_proj", "v_proj"]},
        # No loader workers: a spawned worker imports transformers' trainer module (its seed_worker) on its
        # own, with peft and bitsandbytes, whatever the rank kept out; this measures the rank.
        "data": {"train": [{"path": "data/qa.jsonl"}], "max_seq_length": 64, "num_workers": 0},
        "training": {"max_steps": 2, "per_device_batch_size": 4, "logging_steps": 1},
    }
    for leftover in ("metrics.jsonl", "result.json"):
        (run_dir / leftover).unlink(missing_ok=True)
    (run_dir / "recipe.json").write_text(json.dumps(recipe))
    env = env | {"FLIGHTDECK_WORKSPACE": str(workspace)}  # no rank variables: a group of one, no rendezvous
    argv = [
        sys.executable,
        "-X",
        "importtime",
        "-c",
        _RECIPE_RANK,
        extra or "-",
        str(run_dir / "recipe.json"),
    ]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - started
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {}
    if done.returncode != 0 or result.get("status") != "succeeded":
        raise RuntimeError(f"the rank failed ({done.returncode}, {result}): {done.stderr[-2000:]}")
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    # A refused import (bitsandbytes kept out) leaves one line and no submodule: count modules that loaded parts.
    loaded = [m for m in HEAVY if any(name.startswith(m + ".") for name in imported)]
    return {"seconds": seconds, "loaded": loaded}


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"the child failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _script_rank_environment(
    instrumented: bool, workspace: Path, run_dir: Path, inherited: dict[str, str]
) -> dict[str, str]:
    """What the agent gives rank 0 of 1 of a script job: the launch plan's variables over `inherited`
    (`entrypoint.instrument` on or off), then torchrun's rank variables. The port is a placeholder: the
    loop makes no process group."""
    from flightdeck.inventory import WorkerInventory
    from flightdeck.launch import build_launch_plan
    from flightdeck.recipe import parse_recipe
    from flightdeck.run_variables import RUN_DIR_VARIABLE
    from flightdeck.worker.agent.environment import launch_environment

    recipe = parse_recipe(
        {
            "name": "cold",
            "entrypoint": {"script": "loop.py", "instrument": instrumented},
            "resources": {"accelerator": "cpu"},
        }
    )
    inventory = WorkerInventory(cpu_slots=1, workspace=str(workspace))
    plan = build_launch_plan(recipe, inventory, job_id=1, attempt_number=1, devices=None, database="bench")
    env, _ = launch_environment(plan, inherited, port=29500)
    env.update({RUN_DIR_VARIABLE: str(run_dir), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    env["LOCAL_WORLD_SIZE"] = "1"
    return env


def _measure(variant: str, workspace: Path, run_dir: Path) -> dict[str, Any]:
    base, _, extra = variant.partition("+")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    if base == "recipe-rank":
        return _recipe_rank(extra, workspace, run_dir, env)
    if base == "host-check":
        return _child(_HOST_CHECK % {"heavy": HEAVY}, [extra or "-", str(workspace)], env)
    if base.startswith("loop"):
        env = _script_rank_environment(base == "loop", workspace, run_dir, env)
    return _child(_LOOP % {"heavy": HEAVY}, [extra or "-"], env)


def chosen_variants(given: str) -> list[str]:
    """The variants asked for, each after its baseline (added when not asked for), in VARIANTS' order."""
    asked = {v.strip() for v in given.split(",") if v.strip()}
    unknown = sorted(asked - set(VARIANTS))
    if unknown or not asked:
        raise typer.BadParameter(
            f"--variants: unknown variant {unknown or given!r}; choose from {', '.join(VARIANTS)}"
        )
    while missing := {BASELINE[v] for v in asked if v in BASELINE} - asked:
        asked |= missing
    return [v for v in VARIANTS if v in asked]


def run(
    reps: Reps = 5,
    variants: Annotated[str, typer.Option(help=f"comma-separated, of: {', '.join(VARIANTS)}")] = ",".join(
        VARIANTS
    ),
    results_dir: ResultsDir = RESULTS_DIR,
) -> dict[str, Any]:
    """Seconds to a watched plain loop's first step, to a fresh process's first host check and through a
    recipe rank."""
    chosen = chosen_variants(variants)
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as scratch:
        workspace = _workspace(Path(scratch) / "ws")
        run_dir = Path(scratch) / "run"
        run_dir.mkdir()
        measured = interleaved(reps, chosen, lambda v: _measure(v, workspace, run_dir))
    medians = {v: summary([m["seconds"] for m in runs])["median"] for v, runs in measured.items()}
    results: dict[str, Any] = {}
    table = Table()
    for variant in chosen:
        seconds = summary([m["seconds"] for m in measured[variant]])
        loaded = sorted({name for m in measured[variant] for name in m["loaded"]})
        baseline = BASELINE.get(variant)
        against = ratio(medians[variant], medians[baseline]) if baseline in medians else None
        results[variant] = {"seconds": seconds, "loaded": loaded, "baseline": baseline, "ratio": against}
        table.add(
            variant,
            f"{seconds['median']:.2f}",
            f"{seconds['min']:.2f}-{seconds['max']:.2f}",
            f"{medians[variant] - medians[baseline]:+.2f}" if baseline in medians else "-",
            f"{against:.2f}x {baseline}" if against is not None else "-",
            ", ".join(loaded) or "-",
        )
    table.print(("variant", "median s", "range s", "added s", "ratio", "loaded"))
    write_results("cold_start", {"reps": reps, "variants": results}, results_dir)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
