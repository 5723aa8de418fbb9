"""Run a recipe and turn how it ended into result.json and the process exit code."""

from __future__ import annotations

import traceback
from pathlib import Path

from flightdeck.contracts import CHECKPOINT_STOP_CODE, CHECKPOINT_STOP_EXIT_CODE
from flightdeck.recipe.validate import RecipeInvalid
from flightdeck.worker.instrument.script_end import mark_rank_end
from flightdeck.worker.train.checkpoint_stop import CheckpointStop
from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.health import HealthStop
from flightdeck.worker.train.recipe_run import RecipeRun
from flightdeck.worker.train.result import HEALTH_EXIT_CODE, write_result


def run_to_exit_code(recipe_path: Path) -> int:
    """0 on success, 42 on a health stop (same on every rank), 43 on a stop after a signal's checkpoint
    (G017, every rank), 1 on any other error (traceback in the log)."""
    run = RecipeRun(recipe_path)
    try:
        run.setup()
        output = run.train()
    except HealthStop as stop:
        if run.is_main:
            event = stop.event
            write_result(
                run.run_dir, status="failed", failure_code=event.code, message=event.message, fix=event.fix
            )
        return _leave(run, HEALTH_EXIT_CODE)
    except CheckpointStop as stop:
        if run.is_main:
            write_result(
                run.run_dir,
                status="failed",
                failure_code=CHECKPOINT_STOP_CODE,
                message=f"stopped on {stop.signal_name} after saving checkpoint-{stop.step}: a retry resumes "
                f"from step {stop.step + 1}",
                fix="nothing to fix: a time limit, a preemption or a stop was coming; the job's retry (or a new "
                "submission) resumes from the checkpoint",
            )
        return _leave(run, CHECKPOINT_STOP_EXIT_CODE)
    except DataSourceError as exc:
        if run.is_main:
            write_result(
                run.run_dir, status="failed", failure_code=exc.code, message=exc.message, fix=exc.fix
            )
        traceback.print_exc()
        return 1
    except RecipeInvalid as exc:
        # The trainer validates what it was given; every problem is named, not just counted.
        problems = [f"{f.path or '(recipe)'}: {f.message}" for f in exc.findings]
        code = next((f.code for f in exc.findings if f.code), None)
        message = f"the trainer refused the recipe ({len(problems)} problem(s)): " + "; ".join(problems)
        if run.is_main:
            write_result(
                run.run_dir,
                status="failed",
                failure_code=code,
                message=message,
                findings=[f.model_dump() for f in exc.findings],
            )
        print(f"[flightdeck] {message}", flush=True)
        return 1
    except Exception as exc:
        if run.is_main:
            write_result(run.run_dir, status="failed", message=f"{type(exc).__name__}: {exc}")
        raise
    if run.is_main:
        write_result(run.run_dir, status="succeeded", message="training finished", output_path=str(output))
    return _leave(run, 0)  # every rank passed train()'s last barrier, after the final save


def _leave(run: RecipeRun, exit_code: int) -> int:
    """The rank's run is over and its result written (by rank 0): what is left is teardown, where NCCL's
    destroy_process_group can hang. The marker says so, with the code this rank exits with: the agent
    ends a rank (or torchrun) that outlives it by health.teardown_grace_seconds and takes the run's
    outcome from it (H008)."""
    mark_rank_end(run.run_dir, run.rank, exit_code)
    run.cleanup()
    return exit_code
