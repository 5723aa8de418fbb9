"""The launch environment: the plan's variables over a scrubbed copy of the agent's own."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from service.launch.plan import PORT_VARIABLES, LaunchPlan

# Inherited launcher variables would make torchrun or the ranks join the wrong group (P005).
SCRUBBED_EXACT = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "NODE_RANK",
        "CUDA_VISIBLE_DEVICES",
        # The trainer never holds a credential (DESIGN: a file between trainer and agent).
        "FLIGHTDECK_WORKER_TOKEN",
        "FLIGHTDECK_USER_TOKENS",
        "FLIGHTDECK_WORKER_TOKENS",
    }
)
SCRUBBED_PREFIXES = ("PET_", "TORCHELASTIC_")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (E002)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_scrubbed(name: str) -> bool:
    return name in SCRUBBED_EXACT or name.startswith(SCRUBBED_PREFIXES)


def launch_environment(
    plan: LaunchPlan, inherited: Mapping[str, str], port: int | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """(environment for torchrun, host facts resolved); `port` defaults to a fresh free port."""
    env = {name: value for name, value in inherited.items() if not is_scrubbed(name)}
    resolved: dict[str, str] = {}
    for var in plan.env:
        if var.value is not None:
            env[var.name] = var.value
        elif var.name in PORT_VARIABLES:
            if "port" not in resolved:
                resolved["port"] = str(port if port is not None else free_port())
            env[var.name] = resolved["port"]
    scrubbed = sorted(name for name in inherited if is_scrubbed(name))
    if scrubbed:
        resolved["scrubbed"] = ",".join(scrubbed)
    return env, resolved
