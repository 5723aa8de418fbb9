"""The launch environment: the plan's variables over a scrubbed copy of the agent's own."""

from __future__ import annotations

import os
from collections.abc import Mapping

from flightdeck.launch.plan import LaunchPlan
from flightdeck.launch.variables import PATH_VARIABLE, PORT_VARIABLES
from flightdeck.run_variables import INSTRUMENT_VARIABLE, RESUME_VARIABLE, WORKSPACE_VARIABLE
from flightdeck.worker.host_preflight.environment import is_launcher_variable
from flightdeck.worker.instrument import AUTOLOAD_DIR

# The plan always sets it: an inherited value would hand the ranks the agent's own GPUs.
DEVICE_VARIABLE = "CUDA_VISIBLE_DEVICES"
# The trainer never holds a credential (P005): the worker token, the CLI's user token, any other.
CREDENTIAL_PREFIX = "FLIGHTDECK_"
CREDENTIAL_MARK = "TOKEN"


def is_credential(name: str) -> bool:
    return name.startswith(CREDENTIAL_PREFIX) and CREDENTIAL_MARK in name


def is_scrubbed(name: str) -> bool:
    return is_launcher_variable(name) or name == DEVICE_VARIABLE or is_credential(name)


def launch_environment(
    plan: LaunchPlan,
    inherited: Mapping[str, str],
    *,
    port: int | None = None,
    allocation: Mapping[str, str] | None = None,
    resume_from: str = "",
) -> tuple[dict[str, str], dict[str, str]]:
    """(environment for torchrun, host facts filled in): the plan's variables over a scrubbed copy of
    `inherited`, each open one filled from the one host fact that answers it.

    `port`: the attempt's one rendezvous port (worker/host_preflight/ports.py `resolve_master_port` on
    the host that listens, or node 0's as the start barrier or the allocation reports it); it fills both
    port variables, so PET_MASTER_PORT always equals MASTER_PORT. `allocation`: what a scheduled plan
    leaves open for each node (node 0's address, this node's rank, address and interface:
    worker/slurm/allocation.py), and the GPUs the scheduler allocated, which replace a GPU plan's. `resume_from`: the checkpoint a retry resumes from
    (worker/agent/resume.py); `PYTHONPATH` of a script job: `script_path`.
    """
    env = {name: value for name, value in inherited.items() if not is_scrubbed(name)}
    resolved: dict[str, str] = {}
    for var in plan.env:
        if var.name in PORT_VARIABLES:
            if port is None and var.value is None:
                raise ValueError(
                    f"the plan leaves {var.name} to the host: pass the attempt's port, resolved once "
                    "(resolve_master_port)"
                )
            env[var.name] = resolved["port"] = str(port) if port is not None else str(var.value)
        elif var.value is not None:
            env[var.name] = var.value
        elif allocation and var.name in allocation:
            env[var.name] = allocation[var.name]
            resolved["allocation"] = ",".join(
                filter(None, (resolved.get("allocation"), f"{var.name}={allocation[var.name]}"))
            )
        elif var.name == RESUME_VARIABLE:
            env[var.name] = resume_from
        elif var.name == PATH_VARIABLE:
            env[var.name] = script_path(plan, inherited.get(PATH_VARIABLE))
    if allocation and DEVICE_VARIABLE in allocation and env.get(DEVICE_VARIABLE):
        # The scheduler decided which of the node's GPUs the job holds: the plan's numbering (the
        # worker's free devices) does not know what else runs on the node.
        env[DEVICE_VARIABLE] = allocation[DEVICE_VARIABLE]
        resolved["allocation"] = ",".join(
            filter(None, (resolved.get("allocation"), f"{DEVICE_VARIABLE}={allocation[DEVICE_VARIABLE]}"))
        )
    scrubbed = sorted(name for name in inherited if is_scrubbed(name))
    if scrubbed:
        resolved["scrubbed"] = ",".join(scrubbed)
    return env, resolved


def script_path(plan: LaunchPlan, inherited: str | None) -> str:
    """A script job's PYTHONPATH: the hooks' autoload directory when instrumented, the workspace, then
    whatever the agent's own environment had."""
    parts = [str(AUTOLOAD_DIR)] if plan.env_value(INSTRUMENT_VARIABLE) == "1" else []
    workspace = plan.env_value(WORKSPACE_VARIABLE)
    if workspace:
        parts.append(workspace)
    if inherited:
        parts.append(inherited)
    return os.pathsep.join(parts)
