"""Slurm's client commands (sbatch, scontrol, scancel, sinfo, squeue), run and read back.

Plain text formats that Slurm 20.11 to 24.x all print the same (`scontrol -o`: one `Key=Value` line
per job; `sinfo -o`); `--json` needs a Slurm built with the JSON plugins, which many clusters lack.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from dataclasses import dataclass

# Seconds one client command may take; slurmctld answers within milliseconds unless it is overloaded.
COMMAND_TIMEOUT = 60.0


class SlurmError(Exception):
    """A Slurm command failed; the message is Slurm's own."""


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(
            f"{argv[0]} not found: run the Slurm executor where Slurm's client commands are installed"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:2])} did not answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:2])}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


@dataclass(frozen=True)
class JobState:
    """What `scontrol show job` says of one job."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, TIMEOUT, ...
    reason: str  # why it waits or ended: Resources, Priority, NodeDown, None, ...
    nodes: str  # the node list, e.g. n[1-2]; empty while pending
    exit_code: int | None  # the batch script's exit status once it ended
    signal: int | None  # the signal that ended it, if any

    @property
    def described(self) -> str:
        """Slurm's own words: `PENDING (Resources)`, `RUNNING on n1`, `NODE_FAIL (NodeDown)`."""
        if self.state == "RUNNING":
            return f"RUNNING on {self.nodes}"
        if self.reason and self.reason != "None":
            return f"{self.state} ({self.reason})"
        return self.state


def parse_show_job(line: str) -> JobState:
    """One line of `scontrol -o show job`: space-separated Key=Value pairs (the values read here hold
    no spaces; Comment= and Command= may, and their words without `=` are skipped)."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    exit_code = signal = None
    if ":" in fields.get("ExitCode", ""):
        status, _, sig = fields["ExitCode"].partition(":")
        exit_code, signal = int(status), int(sig) or None
    nodes = fields.get("NodeList", "")
    return JobState(
        job_id=fields.get("JobId", ""),
        state=fields.get("JobState", "UNKNOWN"),
        reason=fields.get("Reason", ""),
        nodes="" if nodes == "(null)" else nodes,
        exit_code=exit_code,
        signal=signal,
    )


def show_job(job_id: str, env: dict[str, str] | None = None) -> JobState | None:
    """The job's state, or None once slurmctld has forgotten it (older than MinJobAge)."""
    try:
        out = run(["scontrol", "-o", "show", "job", job_id], env)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    return parse_show_job(out.strip().splitlines()[0])


def submit(argv: list[str], env: dict[str, str]) -> str:
    """`sbatch --parsable ...`: the job id (the part before `;cluster` on federated clusters)."""
    return run(["sbatch", "--parsable", *argv], env).strip().split(";")[0]


def job_named(name: str, comment: str, env: dict[str, str] | None = None) -> str:
    """The id of the newest of this user's jobs of this name and comment that slurmctld still knows
    (`squeue -t all`), or "". The comment, not the name alone: another database's or another service's
    attempt of the same id has the same name, and taking its job would watch it, or scancel it."""
    # -u, not --me (Slurm 20.11 and later only): the executor's own user, who submitted the job.
    user = pwd.getpwuid(os.getuid()).pw_name
    out = run(["squeue", "-h", "-u", user, "-t", "all", "-n", name, "-o", "%i %k"], env)
    ids = []
    for line in out.splitlines():
        job, _, found = line.strip().partition(" ")
        if job.isdigit() and found.strip() == comment:
            ids.append(job)
    return max(ids, key=int) if ids else ""


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    run(["scancel", job_id], env)


@dataclass(frozen=True)
class PartitionCapacity:
    nodes: int
    cpus_per_node: int
    gpus_per_node: int = 0  # the smallest node's GPUs (GRES `gpu`); 0: a node without GPUs, or none
    gpu_type: str = ""  # GRES's type name (`gpu:a100:4`), several joined by '|'; "" when GRES names none


def partition_capacity(partition: str, env: dict[str, str] | None = None) -> PartitionCapacity:
    """Nodes, the smallest node's CPUs and GPUs in a partition (`sinfo`), whatever their state now."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %c %G"]
    if partition:
        argv += ["-p", partition]
    capacity = parse_partition(run(argv, env))
    if capacity is None:
        raise SlurmError(f"sinfo lists no nodes in partition {partition or '(default)'!r}")
    return capacity


def parse_partition(out: str) -> PartitionCapacity | None:
    """`sinfo -h -N -o "%N %c %G"` lines (a node of several partitions is listed once per partition)."""
    rows = {tuple(line.split()) for line in out.splitlines() if line.strip()}
    if not rows:
        return None
    cpus = [int(row[1].rstrip("+")) for row in rows]
    gpus = [gpu_gres(row[2] if len(row) > 2 else "") for row in rows]
    types = sorted({kind for _, kind in gpus if kind})
    return PartitionCapacity(
        nodes=len({row[0] for row in rows}),
        cpus_per_node=min(cpus),
        gpus_per_node=min(count for count, _ in gpus),
        gpu_type="|".join(types),
    )


# One GRES of a node as sinfo's %G prints it: name, optional type, count, optional socket binding
# (`gpu:a100:4(S:0-1)`); `(null)` when the node has none.
_GRES = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?:(?P<count>\d+)[KMG]?(?:\(.*\))?$")


def gpu_gres(gres: str) -> tuple[int, str]:
    """(GPUs, their type name) in one node's %G: every `gpu` entry counted, e.g. `gpu:a100:4` -> (4, 'a100')."""
    count, types = 0, []
    for entry in re.split(r",(?![^(]*\))", gres):
        found = _GRES.match(entry.strip())
        if found is None or found["name"] != "gpu":
            continue
        count += int(found["count"])
        if found["type"]:
            types.append(found["type"])
    return count, "|".join(sorted(set(types)))


def failed_nodes(node_list: str, env: dict[str, str] | None = None) -> list[str]:
    """The nodes of `node_list` Slurm has as down, failing or not responding (`sinfo -N`: a `*` after
    the state means not responding), e.g. after a NODE_FAIL: the node to name."""
    return parse_failed_nodes(run(["sinfo", "-h", "-N", "-n", node_list, "-o", "%N %t"], env))


def parse_failed_nodes(out: str) -> list[str]:
    """The names in `sinfo -h -N -o "%N %t"` lines whose state is down, failing, drained or not
    responding (`idle*`, `down*`)."""
    return sorted(
        {
            name
            for name, state in (line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
            if state.endswith("*") or state.startswith(("down", "fail", "drain"))
        }
    )


def slurmd_timeout(env: dict[str, str] | None = None) -> float:
    """SlurmdTimeout in seconds (`scontrol show config`: `SlurmdTimeout = 300 sec`): how long slurmctld
    waits before it marks a silent node down."""
    for line in run(["scontrol", "show", "config"], env).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdTimeout":
            return float(value.split()[0])
    raise SlurmError("scontrol show config does not list SlurmdTimeout")


def client_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
