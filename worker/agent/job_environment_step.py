"""The attempt runner's step for `entrypoint.requirements`: the job's interpreter, or E008 before launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.contracts import attempt_event
from flightdeck.inventory import WorkerInventory
from flightdeck.worker.agent import rundir
from flightdeck.worker.agent.classify import Outcome
from flightdeck.worker.agent.job_environment import ENVS_DIR_NAME, RequirementsFailed, job_environment

CODE = "E008"
FIX = (
    "make the requirements file installable from this worker (the names and versions exist on its "
    "package index, or point to local wheels with --find-links / --no-index), or drop what the script "
    "does not need; the whole pip output is in the job's log"
)


@dataclass
class BuiltEnvironment:
    python: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: Outcome | None = None  # set when the attempt must end before launch


def envs_dir(inventory: WorkerInventory) -> Path:
    """Where a worker keeps its jobs' environments: beside the runs, never inside a run."""
    runs = inventory.runs_dir or str(Path(inventory.workspace or ".") / "runs")
    return Path(runs) / ENVS_DIR_NAME


def job_environment_for(
    recipe: dict[str, Any], inventory: WorkerInventory, run_dir: Path, should_stop: Callable[[], bool]
) -> BuiltEnvironment:
    requirements: str = recipe["entrypoint"]["requirements"]
    workspace = Path(inventory.workspace or ".")
    try:
        env = job_environment(
            workspace / requirements,
            envs_dir(inventory),
            run_dir / rundir.LOG_FILE,
            cwd=workspace,
            should_stop=should_stop,
        )
    except RequirementsFailed as exc:
        message = f"the requirements file '{requirements}' could not be installed: {exc.reason}"
        event = attempt_event(
            "preflight:requirements", "preflight", message, code=CODE, severity="error", fix=FIX
        )
        finding = {
            "code": CODE,
            "severity": "error",
            "path": "entrypoint.requirements",
            "where": "host",
            "message": message,
            "fix": FIX,
        }
        outcome = Outcome(
            "failed",
            failure_class="preflight",
            failure_code=CODE,
            message=f"preflight: {CODE} entrypoint.requirements: {message}",
            fix=FIX,
            log_tail=rundir.log_tail(run_dir)[-4000:],
            findings=[finding],
        )
        return BuiltEnvironment(events=[event], outcome=outcome)
    what = "reused" if env.reused else f"built in {env.seconds:.1f} s"
    event = attempt_event(
        "launch:environment",
        "launch",
        f"the job's own environment {env.digest} from '{requirements}' ({what}), over the worker's: "
        f"{env.python}",
        data={
            "digest": env.digest,
            "reused": env.reused,
            "seconds": round(env.seconds, 2),
            "python": str(env.python),
        },
    )
    return BuiltEnvironment(python=str(env.python), events=[event])
