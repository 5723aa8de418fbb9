"""The launch environment the plan decides, one producer per concern (Kubeflow's torch plugin builds its
environment the same way): devices, threads, collectives (NCCL/gloo), rendezvous and run files.

Each producer returns the plan's own variables, each with its reason; a variable that corrects the
recipe carries the catalog code of that decision (E003, E005) and wins over the recipe's value. The
recipe's own values are laid over the rest in one place, `plan_environment`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from flightdeck.contracts import FLIGHT_RECORDER_PREFIX
from flightdeck.inventory import WorkerInventory
from flightdeck.launch.hardware import is_consumer
from flightdeck.launch.variables import PATH_VARIABLE, EnvVar
from flightdeck.recipe.schema import Recipe
from flightdeck.run_variables import (
    INSTRUMENT_VARIABLE,
    RESUME_VARIABLE,
    RUN_DIR_VARIABLE,
    WORKSPACE_VARIABLE,
)

# Collectives each rank's NCCL Flight Recorder keeps (PyTorch's own example value): enough to see
# the last steps' all-reduces, a few MB of host memory.
FLIGHT_RECORDER_ENTRIES = 2000


def device_variables(recipe: Recipe, inventory: WorkerInventory, devices: list[int]) -> list[EnvVar]:
    """Which devices the ranks see and how the model is placed on them (P004, P001)."""
    if inventory.gpus:
        env = [
            EnvVar(
                name="CUDA_DEVICE_ORDER",
                value="PCI_BUS_ID",
                reason="the inventory numbers GPUs as nvidia-smi does, in PCI bus order; CUDA's default "
                "(fastest first) would make CUDA_VISIBLE_DEVICES name other GPUs",
            ),
            EnvVar(
                name="CUDA_VISIBLE_DEVICES",
                value=",".join(str(d) for d in devices),
                reason="the GPUs given to this attempt; rank i uses the i-th visible GPU (P004)",
            ),
        ]
    else:
        env = [
            EnvVar(
                name="CUDA_VISIBLE_DEVICES",
                value="",
                reason="CPU mode: the ranks must not touch a GPU of this host",
            ),
            EnvVar(
                name="ACCELERATE_USE_CPU",
                value="true",
                reason="CPU mode: transformers' Trainer (through accelerate) joins the ranks in one gloo DDP "
                "job only with this or its use_cpu argument; without either, on a host with no GPU, every "
                "rank trains alone on all the data as process 0",
            ),
        ]
    if recipe.model is None or recipe.model.device_map is None:
        env.append(
            EnvVar(
                name="SHIRG_NO_DEVICE_MAP",
                value="1",
                reason="the model is replicated, one full copy per process: load it without a device map so "
                "DDP owns placement (P001)",
            )
        )
    return env


def thread_variables(recipe: Recipe, inventory: WorkerInventory) -> list[EnvVar]:
    """CPU threads per rank (E003, decided here from the worker's cores) and the tokenizers' own threads
    (E004, decided once at submit: the static fix writes TOKENIZERS_PARALLELISM=false into the recipe
    when it is unset, and the plan runs the recipe's value)."""
    processes = recipe.processes_per_node
    fitted = max(1, inventory.cores // processes)
    threads = recipe.env.get("OMP_NUM_THREADS")
    if threads is not None and int(threads) * processes > inventory.cores:
        omp = EnvVar(
            name="OMP_NUM_THREADS",
            value=str(fitted),
            reason=f"{threads} threads x {processes} processes would oversubscribe {inventory.cores} cores and "
            f"slow every step: cores / processes (E003); the recipe's {threads} replaced",
            code="E003",
        )
    else:
        omp = EnvVar(
            name="OMP_NUM_THREADS",
            value=str(fitted),
            reason=f"{inventory.cores} cores / {processes} processes, so the ranks do not oversubscribe the "
            "CPU (E003)",
        )
    env = [omp]
    tokenizers = recipe.env.get("TOKENIZERS_PARALLELISM")
    if tokenizers is not None:
        env.append(
            EnvVar(
                name="TOKENIZERS_PARALLELISM",
                value=tokenizers,
                reason="tokenizer threads deadlock after DataLoader workers fork (E004: submitting sets "
                "false when the recipe leaves it unset)",
            )
        )
    return env


def collective_variables(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], backend: str, run_dir: str
) -> list[EnvVar]:
    """The collectives' backend (NCCL on GPUs, gloo on CPUs), NCCL's transports on this host (E005) and
    its Flight Recorder (H006)."""
    env = [
        EnvVar(
            name="FLIGHTDECK_BACKEND",
            value=backend,
            reason=f"torch.distributed backend for {inventory.accelerator} processes",
        )
    ]
    several = recipe.world_size > 1 and bool(inventory.gpus)
    if several and inventory.nccl_p2p_ok is False:
        env.append(
            EnvVar(
                name="NCCL_P2P_DISABLE",
                value="1",
                reason="the worker found GPU peer-to-peer broken on this host (E005)",
            )
        )
    elif several and inventory.nccl_p2p_ok is not True and _has_consumer_gpu(inventory, devices):
        reason = "consumer GPUs (GeForce, TITAN, RTX) hang in NCCL peer-to-peer transfers (E005)"
        for name in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
            # The recipe's own value is kept (no code): whoever set it knows this host.
            code = None if name in recipe.env else "E005"
            env.append(EnvVar(name=name, value="1", reason=reason, code=code))
    if several:
        env += _flight_recorder(run_dir)
    return env


def rendezvous_variables(recipe: Recipe, master_addr: str | None, scheduled: bool) -> list[EnvVar]:
    """Where the ranks meet: node 0's address and the port, which only a host can resolve (E002, N001)."""
    env: list[EnvVar] = []
    if recipe.resources.nodes == 1:
        port_reason = (
            "resolved on the host by the runner just before launch: the recipe's while it is free there, "
            "else one the kernel reports free (E002)"
        )
    elif scheduled:
        env += _allocation_variables()
        port_reason = (
            "a port the batch script found free on the allocation's first node, where the rendezvous "
            "listens; every node starts with it (E002)"
        )
    else:
        env.append(
            EnvVar(
                name="MASTER_ADDR",
                value=master_addr,
                reason="node 0's address as its worker registered it (--address): every node reaches the "
                "rendezvous there",
            )
        )
        port_reason = (
            "a port node 0's runner found free on its host and reported; every node starts with it once "
            "all nodes passed host preflight (E002)"
        )
    pinned = recipe.env.get("MASTER_PORT")
    env += [
        EnvVar(name="MASTER_PORT", value=None, reason=port_reason),
        # torchrun reads PET_MASTER_PORT as --master-port; it must equal MASTER_PORT.
        EnvVar(name="PET_MASTER_PORT", value=pinned, reason="torchrun's --master-port: MASTER_PORT's value"),
    ]
    return env


def run_file_variables(
    recipe: Recipe, inventory: WorkerInventory, run_dir: str, attempt_number: int
) -> list[EnvVar]:
    """Where the run reads and writes: the workspace, the run directory, the log, a retry's checkpoint,
    and a script job's import path and hooks (docs/own-script.md)."""
    env = [
        EnvVar(
            name="PYTHONUNBUFFERED",
            value="1",
            reason="log lines reach output.log as they are printed, not at exit",
        ),
        EnvVar(
            name=WORKSPACE_VARIABLE,
            value=inventory.workspace,
            reason="recipe paths that are relative resolve against it",
        ),
        EnvVar(
            name=RUN_DIR_VARIABLE,
            value=run_dir,
            reason="rank 0 writes metrics.jsonl and result.json here (the trainer, or FlightdeckCallback in "
            "a script)",
        ),
    ]
    env += _script_variables(recipe)
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
    return env


def plan_environment(
    recipe: Recipe,
    inventory: WorkerInventory,
    devices: list[int],
    *,
    backend: str,
    run_dir: str,
    attempt_number: int,
    master_addr: str | None,
    scheduled: bool,
) -> list[EnvVar]:
    """Every concern's variables, then the recipe's own values laid over them: a plan variable without a
    code yields to the recipe's value (its reason kept, saying so), one with a code is the plan's
    correction and stays; the recipe's other variables follow, set by the recipe."""
    produced = [
        *device_variables(recipe, inventory, devices),
        *thread_variables(recipe, inventory),
        *collective_variables(recipe, inventory, devices, backend, run_dir),
        *run_file_variables(recipe, inventory, run_dir, attempt_number),
        *rendezvous_variables(recipe, master_addr, scheduled),
    ]
    env = [_recipe_over(var, recipe.env) for var in produced]
    planned = {var.name for var in env}
    env += [
        EnvVar(name=name, value=value, reason="set by the recipe")
        for name, value in recipe.env.items()
        if name not in planned
    ]
    return env


def _recipe_over(var: EnvVar, own: Mapping[str, str]) -> EnvVar:
    if var.code is not None or var.name not in own or own[var.name] == var.value:
        return var
    return EnvVar(name=var.name, value=own[var.name], reason=f"set by the recipe ({var.reason})")


def _allocation_variables() -> list[EnvVar]:
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


def _flight_recorder(run_dir: str) -> list[EnvVar]:
    """H006 on NCCL: each rank records its last collectives and writes them when one times out, so a
    hang names the collective each rank was in (the agent's stacks say where in Python)."""
    dump = posixpath.join(run_dir, FLIGHT_RECORDER_PREFIX)
    reason = "the Flight Recorder dumps go in the run directory (<prefix><rank>), reported with the attempt"
    return [
        EnvVar(
            name="TORCH_NCCL_TRACE_BUFFER_SIZE",
            value=str(FLIGHT_RECORDER_ENTRIES),
            reason=f"NCCL Flight Recorder: each rank keeps its last {FLIGHT_RECORDER_ENTRIES} collectives, so "
            "a hang shows which collective each rank was in and which rank never joined (H006)",
        ),
        EnvVar(
            name="TORCH_NCCL_DUMP_ON_TIMEOUT",
            value="1",
            reason="when a collective times out, every rank writes its Flight Recorder buffer before the "
            "watchdog ends it (H006)",
        ),
        EnvVar(name="TORCH_FR_DUMP_TEMP_FILE", value=dump, reason=reason),
        EnvVar(
            name="TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            value=dump,
            reason=reason + " (the name PyTorch before 2.7 reads)",
        ),
    ]


def _script_variables(recipe: Recipe) -> list[EnvVar]:
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
    return any(is_consumer(gpu) for gpu in inventory.gpus if gpu.index in devices)
