"""Host rules on the agent's own process environment and ports (P005, E002)."""

from __future__ import annotations

from collections.abc import Mapping

from flightdeck.preflight.rule_result import RuleResult, correction
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.host_preflight.ports import port_is_free

# Set by torchrun per rank (or read by it as flags); a value inherited from the agent's shell would
# point ranks at the wrong group. The agent scrubs exactly these from the launch (flightdeck.worker.agent.environment).
LAUNCHER_VARIABLES = frozenset(
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
    }
)
# torchrun reads PET_* as defaults for its flags; TORCHELASTIC_* describe a run already under way.
LAUNCHER_PREFIXES = ("PET_", "TORCHELASTIC_")


def is_launcher_variable(name: str) -> bool:
    return name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES)


def inherited_launcher_env(environ: Mapping[str, str]) -> list[RuleResult]:
    """P005: distributed variables in the agent's environment, reported with their values."""
    inherited = {name: environ[name] for name in sorted(environ) if is_launcher_variable(name)}
    if not inherited:
        return []
    listed = ", ".join(f"{name}={value}" for name, value in inherited.items())
    return [
        correction(
            "P005",
            "env",
            f"the worker's environment has {listed}; ranks inheriting them would join the wrong "
            "process group.",
            "the agent removes these from the training environment; torchrun sets them per rank",
            where="host",
        )
    ]


def master_port_in_use(recipe: Recipe) -> list[RuleResult]:
    """E002: a recipe-pinned MASTER_PORT that something on this host already listens on. Reported only:
    the launch resolves the port once, just before torchrun starts (ports.resolve_master_port)."""
    pinned = recipe.env.get("MASTER_PORT")
    if pinned is None or port_is_free(int(pinned)):
        return []
    return [
        correction(
            "E002",
            "env.MASTER_PORT",
            f"MASTER_PORT {pinned} is in use on this host (EADDRINUSE at rendezvous).",
            "the launch takes a port the kernel reports free on this host instead (the launch:port event "
            "and plan.json name it)",
            where="host",
        )
    ]
