"""The launch environment: the plan's variables over a scrubbed copy of the agent's own."""

from __future__ import annotations

import os
from collections.abc import Mapping

from flightdeck.service.contracts import RESUME_VARIABLE
from flightdeck.service.launch.plan import INSTRUMENT_VARIABLE, PATH_VARIABLE, PORT_VARIABLES, LaunchPlan
from flightdeck.worker.host_preflight.environment import is_launcher_variable
from flightdeck.worker.host_preflight.ports import find_free_port
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
    port: int | None = None,
    host_fixed: Mapping[str, str] | None = None,
    allocation: Mapping[str, str] | None = None,
    resume_from: str = "",
) -> tuple[dict[str, str], dict[str, str]]:
    """(environment for torchrun, host facts resolved).

    `allocation`: what a scheduled plan leaves open for each node of the scheduler's allocation
    (node 0's address, this node's rank, address and interface: worker/slurm/allocation.py).

    `host_fixed`: recipe variables host preflight corrected on this host (e.g. a busy pinned
    MASTER_PORT, E002); they win over the plan, which was built before the host was seen.
    `port` defaults to a fresh free port for the port variables the plan leaves open; `resume_from`
    is the checkpoint a retry resumes from (worker/agent/resume.py).
    """
    fixed = dict(host_fixed or {})
    env = {name: value for name, value in inherited.items() if not is_scrubbed(name)}
    resolved: dict[str, str] = {}
    for var in plan.env:
        if var.name in PORT_VARIABLES and "MASTER_PORT" in fixed:
            env[var.name] = fixed["MASTER_PORT"]  # PET_MASTER_PORT must equal MASTER_PORT
        elif var.name in fixed:
            env[var.name] = fixed[var.name]
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
        elif var.name in PORT_VARIABLES:
            if "port" not in resolved:
                resolved["port"] = str(port if port is not None else find_free_port())
            env[var.name] = resolved["port"]
    planned = {var.name for var in plan.env}
    for name, value in fixed.items():
        if name not in planned:
            env[name] = value  # a host fix for a variable the plan does not set
    if fixed:
        resolved["host_fixed"] = ",".join(f"{name}={value}" for name, value in sorted(fixed.items()))
    scrubbed = sorted(name for name in inherited if is_scrubbed(name))
    if scrubbed:
        resolved["scrubbed"] = ",".join(scrubbed)
    return env, resolved


def script_path(plan: LaunchPlan, inherited: str | None) -> str:
    """A script job's PYTHONPATH: the hooks' autoload directory when instrumented, the workspace, then
    whatever the agent's own environment had."""
    parts = [str(AUTOLOAD_DIR)] if plan.env_value(INSTRUMENT_VARIABLE) == "1" else []
    workspace = plan.env_value("FLIGHTDECK_WORKSPACE")
    if workspace:
        parts.append(workspace)
    if inherited:
        parts.append(inherited)
    return os.pathsep.join(parts)
