"""`flightdeck worker --executor slurm`: one worker offering a Slurm partition, its attempts as Slurm jobs."""

from __future__ import annotations

import socket

from flightdeck.worker.agent.agent import Agent, AgentSettings, run_agent
from flightdeck.worker.slurm.commands import SlurmError
from flightdeck.worker.slurm.executor import SlurmExecutor, SlurmSettings, slurm_inventory


def run_slurm_worker(settings: AgentSettings, slurm: SlurmSettings) -> None:
    name = settings.name or f"slurm-{slurm.partition or 'default'}@{socket.gethostname()}"
    settings.name = name
    try:
        inventory = slurm_inventory(slurm, settings.workspace.resolve(), settings.runs_dir.resolve(), name)
    except SlurmError as exc:
        # No partition to offer: nothing to register, and retrying does not help.
        raise SystemExit(f"flightdeck worker --executor slurm: {exc}") from None

    def make_executor(agent: Agent) -> SlurmExecutor:
        return SlurmExecutor(slurm, agent.executor_setup(), service_url=settings.service_url)

    run_agent(settings, inventory, make_executor)
