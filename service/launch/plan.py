"""Builds an attempt's launch plan: the torchrun argv and every environment variable with its reason.

A pure function of (recipe, worker inventory, attempt): the service builds it at claim time,
stores it on the attempt and shows it; the agent runs it as given, resolving only host facts.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from typing import Literal

from flightdeck.service.contracts import FLIGHT_RECORDER_PREFIX, OUTPUT_DIR, RECIPE_FILE, RESUME_VARIABLE
from flightdeck.service.inventory import GpuInfo, WorkerInventory
from flightdeck.service.launch.hardware import is_consumer
from flightdeck.service.recipe.findings import Finding
from flightdeck.service.recipe.schema import Recipe
from pydantic import BaseModel, Field

# The agent replaces this argv[0] with its own interpreter (sys.executable), so torchrun runs
# in the environment the agent was installed into.
PYTHON = "python"
TRAINER_MODULE = "flightdeck.worker.train"
# Port variables whose null value the agent fills with one free port it picked (E002).
PORT_VARIABLES = ("MASTER_PORT", "PET_MASTER_PORT")
# Collectives each rank's NCCL Flight Recorder keeps (PyTorch's own example value): enough to see
# the last steps' all-reduces, a few MB of host memory.
FLIGHT_RECORDER_ENTRIES = 2000
# A null PYTHONPATH in a script job's plan: the agent puts its instrumentation directory (when the
# plan sets FLIGHTDECK_INSTRUMENT) and the workspace there, both host facts.
PATH_VARIABLE = "PYTHONPATH"
INSTRUMENT_VARIABLE = "FLIGHTDECK_INSTRUMENT"
# How long the nodes of a multi-node job wait for each other at torchrun's rendezvous.
RDZV_TIMEOUT_SECONDS = 120
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


class PlanError(ValueError):
    """The attempt cannot be launched on this worker as planned (e.g. too few devices, P004)."""


class EnvVar(BaseModel):
    """One environment variable of the launch; `value` None means the agent resolves it on the host."""

    name: str
    value: str | None
    reason: str
    code: str | None = Field(
        None, description="The catalog code of a decision that corrects the recipe (E003, E005)."
    )


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
    node_rank: int = 0,
    master_addr: str | None = None,
    scheduled: bool = False,
) -> LaunchPlan:
    """The argv and environment that run `recipe` on `inventory` with the given device indices.

    A multi-node job of Flightdeck's own gang has one plan per node: `node_rank` of `resources.nodes`,
    meeting at node 0's `master_addr` (service/gangs/). `scheduled`: a cluster scheduler (Slurm)
    places all the nodes as one job, so one plan serves every node; where node 0 is and which node
    this is are facts of the allocation, left open (None) for the runner on each node to fill
    (`node_plan`, worker/slurm/allocation.py).
    """
    processes = recipe.processes_per_node
    gpu_mode = bool(inventory.gpus)
    assigned = _assigned_devices(recipe, inventory, devices)
    name = f"job-{_safe(job_id)}-attempt-{int(attempt_number)}"
    if node_rank:
        name += f"-node-{int(node_rank)}"  # agents of one host may share a runs directory
    run_dir = posixpath.join(_runs_dir(inventory), name)
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
    env = _environment(recipe, inventory, assigned, backend, run_dir, master_addr, scheduled)
    if attempt_number > 1:
        env.append(
            EnvVar(
                name=RESUME_VARIABLE,
                value=None,
                reason="a retry: the newest complete checkpoint of this job's earlier attempts, found by "
                "the runner on the host ('' when none); the trainer resumes from it, a script reads it "
                "(or '{resume_from}' in its args)",
            )
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


def _program(recipe: Recipe, inventory: WorkerInventory, recipe_path: str, run_dir: str) -> list[str]:
    """What torchrun runs on every rank: the trainer with the recipe, or a script job's own program.

    The script's path is joined to the workspace here so the plan shows the file that runs; the
    agent checks that it really is inside the workspace (symlinks followed) before launching.
    """
    entry = recipe.entrypoint
    if entry is None:
        return ["-m", TRAINER_MODULE, recipe_path]
    places = {
        "{run_dir}": run_dir,
        "{output_dir}": posixpath.join(run_dir, OUTPUT_DIR),
        "{workspace}": inventory.workspace or "",
    }
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


def _environment(
    recipe: Recipe,
    inventory: WorkerInventory,
    devices: list[int],
    backend: str,
    run_dir: str,
    master_addr: str | None,
    scheduled: bool = False,
) -> list[EnvVar]:
    own = recipe.env
    env: list[EnvVar] = []

    def put(name: str, value: str | None, reason: str) -> None:
        if name in own and own[name] != value:
            env.append(EnvVar(name=name, value=own[name], reason=f"set by the recipe ({reason})"))
        else:
            env.append(EnvVar(name=name, value=own.get(name, value), reason=reason))

    def correct(name: str, value: str, reason: str, code: str) -> None:
        """A value the recipe's own would break on this worker: the plan's wins, and says why."""
        env.append(
            EnvVar(name=name, value=value, reason=f"{reason}; the recipe's {own[name]} replaced", code=code)
        )

    processes = recipe.processes_per_node
    if inventory.gpus:
        put(
            "CUDA_DEVICE_ORDER",
            "PCI_BUS_ID",
            "the inventory numbers GPUs as nvidia-smi does, in PCI bus order; CUDA's default "
            "(fastest first) would make CUDA_VISIBLE_DEVICES name other GPUs",
        )
        put(
            "CUDA_VISIBLE_DEVICES",
            ",".join(str(d) for d in devices),
            "the GPUs given to this attempt; rank i uses the i-th visible GPU (P004)",
        )
    else:
        put("CUDA_VISIBLE_DEVICES", "", "CPU mode: the ranks must not touch a GPU of this host")
    fitted = max(1, inventory.cores // processes)
    threads = own.get("OMP_NUM_THREADS")
    if threads is not None and int(threads) * processes > inventory.cores:
        correct(
            "OMP_NUM_THREADS",
            str(fitted),
            f"{threads} threads x {processes} processes would oversubscribe {inventory.cores} cores and slow "
            f"every step: cores / processes (E003)",
            "E003",
        )
    else:
        put(
            "OMP_NUM_THREADS",
            str(fitted),
            f"{inventory.cores} cores / {processes} processes, so the ranks do not oversubscribe the CPU (E003)",
        )
    put("TOKENIZERS_PARALLELISM", "false", "tokenizer threads deadlock after DataLoader workers fork (E004)")
    if recipe.model is None or recipe.model.device_map is None:
        put(
            "SHIRG_NO_DEVICE_MAP",
            "1",
            "the model is replicated, one full copy per process: load it without a device map so DDP "
            "owns placement (P001)",
        )
    put("PYTHONUNBUFFERED", "1", "log lines reach output.log as they are printed, not at exit")
    several = recipe.world_size > 1 and bool(inventory.gpus)
    if several and inventory.nccl_p2p_ok is False:
        put("NCCL_P2P_DISABLE", "1", "the worker found GPU peer-to-peer broken on this host (E005)")
    elif several and inventory.nccl_p2p_ok is not True and _has_consumer_gpu(inventory, devices):
        # The recipe's own NCCL_P2P_DISABLE is kept: whoever set it knows this host.
        reason = "consumer GPUs (GeForce, TITAN, RTX) hang in NCCL peer-to-peer transfers (E005)"
        for name in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
            if name in own:
                put(name, "1", reason)
            else:
                env.append(EnvVar(name=name, value="1", reason=reason, code="E005"))
    if several:
        _flight_recorder(put, run_dir)
    put("FLIGHTDECK_WORKSPACE", inventory.workspace, "recipe paths that are relative resolve against it")
    put(
        "FLIGHTDECK_RUN_DIR",
        run_dir,
        "rank 0 writes metrics.jsonl and result.json here (the trainer, or FlightdeckCallback in a script)",
    )
    put("FLIGHTDECK_BACKEND", backend, f"torch.distributed backend for {inventory.accelerator} processes")
    env += _script_environment(recipe)
    if recipe.resources.nodes == 1:
        port_reason = "free port picked on the host by the agent (E002)"
    elif scheduled:
        env += _allocation_environment()
        port_reason = (
            "a port the batch script found free on the allocation's first node, where the rendezvous "
            "listens; every node starts with it (E002)"
        )
    else:
        put(
            "MASTER_ADDR",
            master_addr,
            "node 0's address as its worker registered it (--address): every node reaches the "
            "rendezvous there",
        )
        port_reason = (
            "a port node 0's agent found free on its host and reported; every node starts with it once "
            "all nodes passed host preflight (E002)"
        )
    put("MASTER_PORT", None, port_reason)
    # torchrun reads PET_MASTER_PORT as --master-port; it must equal MASTER_PORT.
    env.append(
        EnvVar(name="PET_MASTER_PORT", value=own.get("MASTER_PORT"), reason="torchrun's --master-port")
    )
    planned = {var.name for var in env}
    for name, value in own.items():
        if name not in planned:
            env.append(EnvVar(name=name, value=value, reason="set by the recipe"))
    return env


def _allocation_environment() -> list[EnvVar]:
    """Where the nodes of a scheduler's allocation meet: facts of the allocation, not of the claim, so
    the runner on each node fills them (N001: an address every node reaches, never a hostname that
    may resolve to loopback; one interface for gloo's sockets)."""
    first = "the address of the allocation's first node as the scheduler lists it (Slurm: its NodeAddr)"
    return [
        EnvVar(name="MASTER_ADDR", value=None, reason=f"{first}: node 0 hosts the rendezvous (N001)"),
        EnvVar(name="PET_MASTER_ADDR", value=None, reason="torchrun's --master-addr: " + first),
        EnvVar(
            name="PET_NODE_RANK",
            value=None,
            reason="torchrun's --node-rank: this node's place in the allocation (Slurm: SLURM_NODEID)",
        ),
        EnvVar(
            name="PET_LOCAL_ADDR",
            value=None,
            reason="torchrun's --local-addr: this node's own address, which its peers reach (a hostname "
            "may resolve to 127.0.0.1 on the node)",
        ),
        EnvVar(
            name="GLOO_SOCKET_IFNAME",
            value=None,
            reason="the network interface holding this node's address: gloo otherwise binds the address "
            "the hostname resolves to, which peers may not reach, and the job hangs",
        ),
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


def _flight_recorder(put: Callable[[str, str | None, str], None], run_dir: str) -> None:
    """H006 on NCCL: each rank records its last collectives and writes them when one times out, so a
    hang names the collective each rank was in (the agent's stacks say where in Python)."""
    put(
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        str(FLIGHT_RECORDER_ENTRIES),
        f"NCCL Flight Recorder: each rank keeps its last {FLIGHT_RECORDER_ENTRIES} collectives, so a hang "
        "shows which collective each rank was in and which rank never joined (H006)",
    )
    put(
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "1",
        "when a collective times out, every rank writes its Flight Recorder buffer before the watchdog "
        "ends it (H006)",
    )
    dump = posixpath.join(run_dir, FLIGHT_RECORDER_PREFIX)
    reason = "the Flight Recorder dumps go in the run directory (<prefix><rank>), reported with the attempt"
    put("TORCH_FR_DUMP_TEMP_FILE", dump, reason)
    put("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", dump, reason + " (the name PyTorch before 2.7 reads)")


def _script_environment(recipe: Recipe) -> list[EnvVar]:
    """A script job runs in its attempt's directory: the workspace on the path, and, instrumented, the
    hooks that watch the unmodified script (docs/own-script.md)."""
    entry = recipe.entrypoint
    if entry is None:
        return []
    env = []
    if entry.instrument:
        env.append(
            EnvVar(
                name=INSTRUMENT_VARIABLE,
                value="1",
                reason="entrypoint.instrument: each rank installs Flightdeck's hooks (FlightdeckCallback in every "
                "HF Trainer, the optimizer step watch of a plain loop, the end of the script marked) with no "
                "edit to the script",
            )
        )
    loads = (
        "Flightdeck's autoload directory (a sitecustomize that installs the hooks), then "
        if entry.instrument
        else ""
    )
    env.append(
        EnvVar(
            name=PATH_VARIABLE,
            value=None,
            reason=f"{loads}the workspace, so that the script's own modules import although it runs in its "
            "attempt's directory; set by the agent (where they are is a fact of the host)",
        )
    )
    return env


def _has_consumer_gpu(inventory: WorkerInventory, devices: list[int]) -> bool:
    chosen: list[GpuInfo] = [gpu for gpu in inventory.gpus if gpu.index in devices]
    return any(is_consumer(gpu) for gpu in chosen)


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
