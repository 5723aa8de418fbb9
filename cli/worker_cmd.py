"""`flightdeck worker`: start an agent that registers this host and runs the jobs it claims."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from flightdeck.run_variables import WORKSPACE_VARIABLE


def register(app: typer.Typer) -> None:
    """Add the `worker` command to `app`."""
    app.command("worker")(worker)


WORKER_TOKENS_LINE = "FLIGHTDECK_WORKER_TOKENS="


def _worker_token(token: str | None, token_file: Path | None) -> str:
    """The token from --token / FLIGHTDECK_WORKER_TOKEN, else from the file; a clear error without one."""
    if token:
        return token
    if token_file is None:
        raise typer.BadParameter(
            "no worker token: set FLIGHTDECK_WORKER_TOKEN, or pass --token-file FILE (a file holding the "
            "token, or the service's <data dir>/tokens.env)",
            param_hint="--token-file",
        )
    try:
        text = token_file.read_text()
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {token_file}: {exc.strerror}", param_hint="--token-file"
        ) from None
    # The service's tokens.env names its tokens; a plain file holds just the token.
    named = [line for line in text.splitlines() if line.startswith(WORKER_TOKENS_LINE)]
    found = named[0][len(WORKER_TOKENS_LINE) :].split(",")[0].strip() if named else text.strip()
    if not found or "\n" in found or ("=" in found and not named):
        raise typer.BadParameter(
            f"{token_file} holds no worker token (one line with the token, or a tokens.env with "
            f"{WORKER_TOKENS_LINE}...)",
            param_hint="--token-file",
        )
    return found


def worker(
    service: Annotated[str, typer.Option(envvar="FLIGHTDECK_SERVICE_URL", help="Service URL.")],
    token: Annotated[
        str | None,
        typer.Option(
            envvar="FLIGHTDECK_WORKER_TOKEN",
            help="Worker token. Set it in the environment (or use --token-file): on argv every `ps` shows it.",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="FLIGHTDECK_WORKER_TOKEN_FILE",
            help="A file holding the worker token, or the service's tokens.env (its first "
            "FLIGHTDECK_WORKER_TOKENS entry is used).",
        ),
    ] = None,
    workspace: Annotated[
        Path, typer.Option(envvar=WORKSPACE_VARIABLE, help="Relative recipe paths resolve against it.")
    ] = Path("."),
    runs_dir: Annotated[
        Path | None, typer.Option(envvar="FLIGHTDECK_RUNS_DIR", help="Default: WORKSPACE/runs.")
    ] = None,
    cpu_slots: Annotated[
        int | None,
        typer.Option(envvar="FLIGHTDECK_CPU_SLOTS", min=1, help="CPU mode: gloo processes to run."),
    ] = None,
    name: Annotated[
        str, typer.Option(envvar="FLIGHTDECK_WORKER_NAME", help="Worker name (default: the hostname).")
    ] = "",
    poll_wait: Annotated[float, typer.Option(min=0, help="Seconds one claim long-poll waits.")] = 20.0,
    cancel_grace: Annotated[float, typer.Option(min=0, help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    allowed_root: Annotated[
        list[Path] | None,
        typer.Option(
            envvar="FLIGHTDECK_ALLOWED_ROOTS",
            help="Another directory recipe paths may point into (repeatable; the workspace and runs dir "
            "always are). Paths outside every root are refused (S001).",
        ),
    ] = None,
    address: Annotated[
        str,
        typer.Option(
            envvar="FLIGHTDECK_WORKER_ADDRESS",
            help="The address other workers reach this host at (node 0 of a multi-node job hosts the "
            "rendezvous there). Default: the address the hostname resolves to; set it on hosts with "
            "several networks.",
        ),
    ] = "",
    scripts: Annotated[
        bool,
        typer.Option(
            "--scripts/--no-scripts",
            envvar="FLIGHTDECK_SCRIPTS",
            help="Whether this worker runs script jobs (a recipe entrypoint: the user's own code). "
            "--no-scripts: recipe jobs only; shown in `flightdeck workers`.",
        ),
    ] = True,
    scripts_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="FLIGHTDECK_SCRIPTS_DIR",
            help="Run script jobs only from this directory (relative to the workspace, or absolute "
            "inside it), e.g. a reviewed checkout of the team's training code. Default: anywhere in "
            "the workspace outside dot-directories and the runs directory.",
        ),
    ] = None,
    executor: Annotated[
        str,
        typer.Option(
            envvar="FLIGHTDECK_EXECUTOR",
            help="Where attempts run: 'inprocess' (this host) or 'slurm' (one Slurm job per attempt, "
            "submitted from this host; docs/slurm.md).",
        ),
    ] = "inprocess",
    slurm_partition: Annotated[
        str, typer.Option(envvar="FLIGHTDECK_SLURM_PARTITION", help="Slurm: sbatch --partition.")
    ] = "",
    slurm_account: Annotated[
        str, typer.Option(envvar="FLIGHTDECK_SLURM_ACCOUNT", help="Slurm: sbatch --account.")
    ] = "",
    slurm_qos: Annotated[str, typer.Option(envvar="FLIGHTDECK_SLURM_QOS", help="Slurm: sbatch --qos.")] = "",
    slurm_time: Annotated[
        str, typer.Option(envvar="FLIGHTDECK_SLURM_TIME", help="Slurm: sbatch --time, e.g. 04:00:00.")
    ] = "",
    slurm_warning_seconds: Annotated[
        int,
        typer.Option(
            envvar="FLIGHTDECK_SLURM_WARNING_SECONDS",
            min=1,
            help="Slurm: seconds before a job's time limit (or a preemption) that Slurm warns it "
            "(sbatch --signal=B:USR1@N); a recipe job with checkpoints saves one and stops, and its retry "
            "resumes from it. One training step and a save must fit in it.",
        ),
    ] = 120,
    slurm_gpu_memory_gb: Annotated[
        float,
        typer.Option(
            envvar="FLIGHTDECK_SLURM_GPU_MEMORY_GB",
            min=0,
            help="Slurm: each GPU's memory in GB, which sinfo's GRES does not say (0: unknown; a recipe "
            "with resources.gpu_memory_gb then waits, and why-waiting says so).",
        ),
    ] = 0.0,
    slurm_gpu_capability: Annotated[
        str,
        typer.Option(
            envvar="FLIGHTDECK_SLURM_GPU_CAPABILITY",
            help="Slurm: the GPUs' CUDA compute capability, e.g. 8.0 for A100, which GRES does not say "
            "(empty: unknown; a recipe needing bf16 then waits, and why-waiting says so).",
        ),
    ] = "",
    slurm_option: Annotated[
        list[str] | None,
        typer.Option(help="Slurm: another sbatch option, e.g. --slurm-option=--mem=32G (repeatable)."),
    ] = None,
    slurm_relay: Annotated[
        bool,
        typer.Option(
            "--slurm-relay/--no-slurm-relay",
            envvar="FLIGHTDECK_SLURM_RELAY",
            help="Slurm: the compute nodes cannot reach the service; this worker carries their metrics, "
            "logs, events and reports from the shared runs directory while the job runs (docs/slurm.md).",
        ),
    ] = False,
    slurm_state_file: Annotated[
        Path | None,
        typer.Option(
            envvar="FLIGHTDECK_SLURM_STATE_FILE",
            help="Slurm: where the worker keeps its identity, so that restarted it finds its running "
            "Slurm jobs again (default ~/.local/state/flightdeck/<name>-<service hash>.json, one per service; "
            "keep it off the runs directory).",
        ),
    ] = None,
) -> None:
    """Run a worker agent: register, pull jobs, launch torchrun, ship logs and metrics."""
    worker_token = _worker_token(
        token, token_file
    )  # before the agent's imports: a missing token says so at once
    # Imported here so `flightdeck` starts fast and the service image needs no worker code paths.
    from flightdeck.worker.agent.agent import AgentSettings, run_agent

    if executor not in ("inprocess", "slurm"):
        raise typer.BadParameter(f"{executor!r}: use 'inprocess' or 'slurm'", param_hint="--executor")
    for option, directory in [
        ("--workspace", workspace),
        *(("--allowed-root", r) for r in allowed_root or ()),
    ]:
        if not directory.is_dir():
            raise typer.BadParameter(
                f"{directory}: not a directory (create it, or name the directory the recipes' paths are "
                "relative to)",
                param_hint=option,
            )
    workspace = workspace.resolve()
    settings = AgentSettings(
        service_url=service,
        token=worker_token,
        workspace=workspace,
        runs_dir=(runs_dir or workspace / "runs").resolve(),
        cpu_slots=cpu_slots,
        name=name,
        poll_wait=poll_wait,
        cancel_grace=cancel_grace,
        allowed_roots=tuple(p.resolve() for p in allowed_root or ()),
        runs_scripts=scripts,
        scripts_dir=scripts_dir,
        address=address,
    )
    if executor == "slurm":
        from flightdeck.worker.slurm.executor import SlurmSettings
        from flightdeck.worker.slurm.worker import run_slurm_worker

        slurm = SlurmSettings(slurm_partition, slurm_account, slurm_qos, slurm_time, list(slurm_option or ()))
        slurm.state_file = slurm_state_file.resolve() if slurm_state_file else None
        slurm.warning_seconds = slurm_warning_seconds
        slurm.relay = slurm_relay
        if slurm_gpu_capability and not re.fullmatch(r"\d{1,2}\.\d{1,2}", slurm_gpu_capability):
            raise typer.BadParameter(
                f"{slurm_gpu_capability!r}: a compute capability as MAJOR.MINOR, e.g. 8.0 (A100) or 9.0 (H100)",
                param_hint="--slurm-gpu-capability",
            )
        slurm.gpu_memory_gb, slurm.gpu_capability = slurm_gpu_memory_gb, slurm_gpu_capability
        run_slurm_worker(settings, slurm)
    else:
        run_agent(settings)
