"""Builds an attempt's launch plan: the torchrun argv and every environment variable with its reason.

A pure function of (recipe, worker inventory, attempt): the service builds it at claim time,
stores it on the attempt and shows it; the agent runs it as given, resolving only host facts.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from flightdeck.contracts import OUTPUT_DIR, RECIPE_FILE
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.environment import plan_environment
from flightdeck.launch.variables import EnvVar
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe

# The agent replaces this argv[0] with its own interpreter (sys.executable), so torchrun runs
# in the environment the agent was installed into.
PYTHON = "python"
TRAINER_MODULE = "flightdeck.worker.train"
# How long the nodes of a multi-node job wait for each other at torchrun's rendezvous.
RDZV_TIMEOUT_SECONDS = 120
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
_DATABASE_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class PlanError(ValueError):
    """The attempt cannot be launched on this worker as planned (e.g. too few devices, P004)."""


class LaunchPlan(BaseModel):
    """The exact launch of one attempt on one worker."""

    argv: list[str]
    env: list[EnvVar]
    run_dir: str
    recipe_path: str
    nproc_per_node: int = Field(ge=1)
    nnodes: int = Field(ge=1)
    backend: Literal["nccl", "gloo"]
    devices: list[int]

    def env_value(self, name: str) -> str | None:
        """The planned value of `name` (None when unset or left to the agent)."""
        for var in self.env:
            if var.name == name:
                return var.value
        return None


def build_launch_plan(
    recipe: Recipe,
    inventory: WorkerInventory,
    *,
    job_id: str | int,
    attempt_number: int,
    devices: Sequence[int] | None,
    database: str,
    node_rank: int = 0,
    master_addr: str | None = None,
    scheduled: bool = False,
) -> LaunchPlan:
    """The argv and environment that run `recipe` on `inventory` with the given device indices.

    A multi-node job of Flightdeck's own gang has one plan per node: `node_rank` of `resources.nodes`,
    meeting at node 0's `master_addr` (service/gangs/). `scheduled`: a cluster scheduler (Slurm)
    places all the nodes as one job, so one plan serves every node; where node 0 is and which node
    this is are facts of the allocation, left open (None) for the runner on each node to fill
    (`node_plan`, worker/slurm/allocation.py). `database`: the id of the service's database
    (models.DatabaseIdentity); the run directory is `<runs>/<database>/job-<id>-attempt-<n>`, because
    job ids start again at 1 in a fresh database and another database's run there must not be reused.
    """
    processes = recipe.processes_per_node
    gpu_mode = bool(inventory.gpus)
    assigned = _assigned_devices(recipe, inventory, devices)
    name = f"job-{_safe(job_id)}-attempt-{int(attempt_number)}"
    if node_rank:
        name += f"-node-{int(node_rank)}"  # agents of one host may share a runs directory
    run_dir = posixpath.join(database_runs(_runs_dir(inventory), database), name)
    recipe_path = posixpath.join(run_dir, RECIPE_FILE)
    backend: Literal["nccl", "gloo"] = "nccl" if gpu_mode else "gloo"
    argv = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(recipe.resources.nodes),
        "--nproc_per_node",
        str(processes),
        *_rendezvous_args(recipe, node_rank, master_addr, scheduled),
        *_program(recipe, inventory, recipe_path, run_dir),
    ]
    env = plan_environment(
        recipe,
        inventory,
        assigned,
        backend=backend,
        run_dir=run_dir,
        attempt_number=attempt_number,
        master_addr=master_addr,
        scheduled=scheduled,
    )
    return LaunchPlan(
        argv=argv,
        env=env,
        run_dir=run_dir,
        recipe_path=recipe_path,
        nproc_per_node=processes,
        nnodes=recipe.resources.nodes,
        backend=backend,
        devices=assigned,
    )


# What a script job's args may name, replaced in the plan; '{resume_from}' (contracts.RESUME_PLACE) is
# replaced on the host by the runner.
RUN_PLACES = ("{run_dir}", "{output_dir}", "{workspace}")


def _program(recipe: Recipe, inventory: WorkerInventory, recipe_path: str, run_dir: str) -> list[str]:
    """What torchrun runs on every rank: the trainer with the recipe, or a script job's own program.

    The script's path is joined to the workspace here so the plan shows the file that runs; the
    agent checks that it really is inside the workspace (symlinks followed) before launching.
    """
    entry = recipe.entrypoint
    if entry is None:
        return ["-m", TRAINER_MODULE, recipe_path]
    places = dict(
        zip(
            RUN_PLACES, (run_dir, posixpath.join(run_dir, OUTPUT_DIR), inventory.workspace or ""), strict=True
        )
    )
    args = [_fill_places(arg, places) for arg in entry.args]
    head = ["-m", str(entry.module)] if entry.module is not None else [str(entry.script)]
    if entry.script is not None and inventory.workspace:
        head = [posixpath.join(inventory.workspace, entry.script)]
    return [*head, *args]


def _fill_places(arg: str, places: dict[str, str]) -> str:
    """'{run_dir}', '{output_dir}', '{workspace}' replaced; any other brace is the script's own
    ('{resume_from}' is a host fact: the runner replaces it, worker/agent/resume.py)."""
    for name, value in places.items():
        arg = arg.replace(name, value)
    return arg


def _assigned_devices(recipe: Recipe, inventory: WorkerInventory, devices: Sequence[int] | None) -> list[int]:
    """The devices the attempt gets: gpus_per_node of those offered (a device-mapped model spans them all)."""
    offered = list(devices) if devices else list(range(inventory.device_count))
    if inventory.gpus:
        known = {gpu.index for gpu in inventory.gpus}
        offered = [d for d in offered if d in known]
    wanted = recipe.resources.gpus_per_node
    if len(offered) < wanted:
        unit = "GPUs" if inventory.gpus else "CPU slots"
        raise PlanError(
            f"P004: the recipe needs {wanted} {unit} per node but the worker offers {len(offered)}; "
            "lower resources.gpus_per_node or use a bigger worker"
        )
    return offered[:wanted]


def database_runs(runs_dir: str, database: str) -> str:
    """Where the run directories of one database's attempts are: `<runs>/<database>/`."""
    if not _DATABASE_FOLDER.fullmatch(database):  # '', '..' or a path would put runs elsewhere
        raise ValueError(f"database id {database!r} is not a folder name: [A-Za-z0-9][A-Za-z0-9_.-]*")
    return posixpath.join(runs_dir, database)


def _runs_dir(inventory: WorkerInventory) -> str:
    if inventory.runs_dir:
        return inventory.runs_dir
    return posixpath.join(inventory.workspace or "/tmp/flightdeck", "runs")


def _safe(job_id: str | int) -> str:
    return _SAFE_ID.sub("_", str(job_id))[:64] or "job"


def _rendezvous_args(recipe: Recipe, node_rank: int, master_addr: str | None, scheduled: bool) -> list[str]:
    """torchrun's static rendezvous: every node names node 0's address and its own rank.

    torchrun takes --master-port from PET_MASTER_PORT: on one node the port the agent checked is
    free (E002; --standalone would hide it from preflight), on several the one node 0's agent found
    free and reported before any node started. Not c10d: it ignores --node-rank, takes the master
    address from the host's FQDN (which peers may not resolve) and waits 600 s on a mismatched id.
    """
    if recipe.resources.nodes == 1:
        return ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--node-rank", "0"]
    if scheduled:
        # torchrun reads --master-addr, --node-rank and --local-addr from PET_MASTER_ADDR, PET_NODE_RANK
        # and PET_LOCAL_ADDR, which the runner on each node fills from the allocation (_environment).
        return ["--rdzv-backend", "static", "--rdzv-conf", f"timeout={RDZV_TIMEOUT_SECONDS}"]
    if not master_addr:
        raise PlanError("a multi-node plan needs node 0's address (the worker's registered address)")
    # Nodes start within a second of each other (the agents' start barrier), so a node still missing
    # after RDZV_TIMEOUT_SECONDS is gone: fail then, not after torchrun's default 600 s (N001).
    return [
        "--rdzv-backend",
        "static",
        "--master-addr",
        master_addr,
        "--node-rank",
        str(int(node_rank)),
        "--rdzv-conf",
        f"timeout={RDZV_TIMEOUT_SECONDS}",
    ]


def node_plan(plan: LaunchPlan, node_rank: int) -> LaunchPlan:
    """Node `node_rank`'s copy of a scheduled plan: its own run directory (`<run_dir>-node-<rank>`, as a
    gang's node plans name theirs), since the nodes of one allocation often share a filesystem."""
    if node_rank == 0:
        return plan
    own = f"{plan.run_dir}-node-{int(node_rank)}"

    def moved(text: str) -> str:
        return own + text[len(plan.run_dir) :] if text.startswith(plan.run_dir) else text

    return plan.model_copy(
        update={
            "run_dir": own,
            "recipe_path": moved(plan.recipe_path),
            "argv": [moved(arg) for arg in plan.argv],
            "env": [
                var.model_copy(update={"value": moved(var.value)}) if var.value else var for var in plan.env
            ],
        }
    )


def plan_findings(plan: LaunchPlan) -> list[Finding]:
    """What the plan corrects or adds for this worker (E003, E005), as findings for a dry run and events
    at launch: the decision is the plan's, made once at claim from the inventory."""
    return [
        Finding(
            code=var.code,
            severity="fix",
            path=f"env.{var.name}",
            message=var.reason,
            fix=f"{var.name}={var.value}",
            value=var.value,
            where="host",
        )
        for var in plan.env
        if var.code is not None
    ]
