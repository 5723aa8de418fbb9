"""The launch composed in one place: the plan, run with what only the host knows.

Each host fact is produced by its own concern before this: the rendezvous port (resolved once,
worker/host_preflight/ports.py, or received from node 0 or the allocation), the allocation's addresses
(worker/slurm/allocation.py), a retry's checkpoint (worker/agent/resume.py) and the interpreter of a
script job's own environment (worker/agent/job_environment_step.py). `compose_launch` lays them over
the plan once; nothing changes the argv or the environment after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.contracts import attempt_event
from flightdeck.launch.plan import PYTHON, LaunchPlan, plan_findings
from flightdeck.launch.variables import PORT_VARIABLES, EnvVar
from flightdeck.worker.agent.environment import launch_environment
from flightdeck.worker.agent.resume import fill_resume_place
from flightdeck.worker.host_preflight.ports import ResolvedPort


@dataclass(frozen=True)
class Launch:
    """What runs: torchrun's argv and environment, and the plan's variables as run, each with its reason."""

    argv: list[str]
    env: dict[str, str]
    variables: list[EnvVar]
    port: ResolvedPort
    facts: dict[str, str]  # host facts filled in: the allocation's, the scrubbed names (P005)

    def record(self, plan: LaunchPlan) -> dict[str, Any]:
        """plan.json: the plan as launched (its argv[0] still the plan's `python`)."""
        argv = [PYTHON, *self.argv[1:]] if plan.argv[:1] == [PYTHON] else list(self.argv)
        return {**plan.model_dump(), "argv": argv, "env": [v.model_dump() for v in self.variables]}

    def events(self, plan: LaunchPlan) -> list[dict[str, Any]]:
        """The plan's corrections for this worker (E003, E005, decided at claim), the port and why, and the
        inherited variables the launch removed (P005)."""
        events = [
            attempt_event(f"launch:{f.path}", "launch", f.message, code=f.code, severity="fix", fix=f.fix)
            for f in plan_findings(plan)
        ]
        events.append(
            attempt_event(
                "launch:port",
                "launch",
                f"MASTER_PORT {self.port.port}: {self.port.reason}",
                code="E002",
                data={"port": str(self.port.port), **self.facts},
            )
        )
        if "scrubbed" in self.facts:
            events.append(
                attempt_event(
                    "launch:scrubbed",
                    "launch",
                    f"removed inherited {self.facts['scrubbed']} from the launch",
                    code="P005",
                    data=self.facts,
                )
            )
        return events


def compose_launch(
    plan: LaunchPlan,
    inherited: Mapping[str, str],
    *,
    port: ResolvedPort,
    python: str,
    resume_from: str = "",
    allocation: Mapping[str, str] | None = None,
) -> Launch:
    """The plan's argv and environment with the host's facts: the one port in both port variables, the
    allocation's addresses, the checkpoint in the argv's '{resume_from}', the interpreter as argv[0]."""
    env, facts = launch_environment(
        plan, inherited, port=port.port, allocation=allocation, resume_from=resume_from
    )
    argv = fill_resume_place(list(plan.argv), resume_from)
    if argv[:1] == [PYTHON]:
        argv[0] = python
    variables = [_as_run(var, env, port) for var in plan.env]
    facts.pop("port", None)
    return Launch(argv=argv, env=env, variables=variables, port=port, facts=facts)


def _as_run(var: EnvVar, env: Mapping[str, str], port: ResolvedPort) -> EnvVar:
    if var.name in PORT_VARIABLES:
        # The plan's reason says who resolves it; the port's says what it resolved to and why.
        return EnvVar(
            name=var.name, value=env[var.name], reason=f"{var.reason}: {port.reason}", code=port.code
        )
    value = env.get(var.name)
    if value == var.value:
        return var
    if var.value is not None:
        # Only the scheduler's allocation replaces a value the plan decided (the GPUs Slurm gave the node).
        return var.model_copy(update={"value": value, "reason": f"{var.reason}; the allocation's instead"})
    return var.model_copy(update={"value": value})
