"""This node's place in a Slurm allocation, read on the node by the attempt runner (`srun` starts one
per node): which node it is, where node 0 is, and which address and interface its peers reach.

Slurm's own words, not the hostname: on many clusters (and on the tests' cluster) a node's hostname
resolves to 127.0.0.1 on the node itself, so the addresses are the nodes' `NodeAddr` as slurmctld
lists them (`scontrol show node`), which is what Slurm itself uses to reach them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from flightdeck.worker.slurm import commands

# The batch script (on the allocation's first node) exports the port it found free there.
PORT_VARIABLE = "FLIGHTDECK_MASTER_PORT"
# Where the runner of the allocation's first node writes its pid: the batch script forwards Slurm's
# warning signal (sbatch --signal=B:USR1@N, which reaches only the batch shell) to it.
RUNNER_PID_VARIABLE = "FLIGHTDECK_RUNNER_PID_FILE"
GPUS_VARIABLE = "CUDA_VISIBLE_DEVICES"
# Set by slurmstepd when the step was allocated GPUs; CUDA_VISIBLE_DEVICES alone may be the submitting
# host's own value, which sbatch exports.
_STEP_GPUS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


@dataclass(frozen=True)
class NodeFacts:
    """What the plan of a scheduled job leaves open, as found on this node."""

    name: str  # this node's name in Slurm (SLURMD_NODENAME)
    rank: int
    nnodes: int
    master_addr: str
    local_addr: str
    interface: str
    port: int
    # The GPUs Slurm gave this node's step (its CUDA_VISIBLE_DEVICES, set with the GRES it allocated);
    # None when it allocated none.
    gpus: str | None = None

    def environment(self) -> dict[str, str]:
        """The plan's open variables (flightdeck/launch/plan.py `_allocation_environment`), filled, and the
        GPUs Slurm allocated, which win over the plan's (worker/agent/environment.py)."""
        filled = {
            "MASTER_ADDR": self.master_addr,
            "PET_MASTER_ADDR": self.master_addr,
            "PET_NODE_RANK": str(self.rank),
            "PET_LOCAL_ADDR": self.local_addr,
            "GLOO_SOCKET_IFNAME": self.interface,
        }
        if self.gpus is not None:
            filled[GPUS_VARIABLE] = self.gpus
        return filled


class AllocationError(RuntimeError):
    """The runner is not where a Slurm job step puts it, or Slurm does not know its nodes."""


def node_facts(environ: Mapping[str, str] | None = None) -> NodeFacts:
    """This node's facts from the job step's environment and slurmctld (two `scontrol` calls)."""
    env = dict(os.environ if environ is None else environ)
    missing = [name for name in ("SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURMD_NODENAME") if name not in env]
    if missing:
        raise AllocationError(
            f"{', '.join(missing)} not set: the runner of a Slurm job must be started by srun inside the job"
        )
    rank = int(env["SLURM_NODEID"])
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
    names = commands.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], env).split()
    if not names:
        raise AllocationError(f"scontrol lists no node in {env['SLURM_JOB_NODELIST']!r}")
    first, me = names[0], env["SLURMD_NODENAME"]
    addresses = node_addresses(sorted({first, me}), env)
    port = env.get(PORT_VARIABLE, "")
    if nnodes > 1 and not port.isdigit():
        raise AllocationError(
            f"{PORT_VARIABLE} not set: the batch script finds the rendezvous port on node 0"
        )
    local = local_address(addresses[me], addresses[first])
    return NodeFacts(
        name=me,
        rank=rank,
        nnodes=nnodes,
        master_addr=addresses[first],
        local_addr=local,
        interface=interface_of(local),
        port=int(port or 0),
        gpus=env.get(GPUS_VARIABLE, "") if any(env.get(name) for name in _STEP_GPUS) else None,
    )


def node_addresses(names: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """Each node's NodeAddr (`scontrol -o show node`: one `Key=Value` line per node)."""
    out = commands.run(["scontrol", "-o", "show", "node", ",".join(names)], dict(env))
    return parse_node_addresses(out)


def parse_node_addresses(out: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = dict(token.partition("=")[::2] for token in line.split() if "=" in token)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found


def local_address(own: str, master: str) -> str:
    """This node's address its peers reach: its NodeAddr where that is an address of this host; else
    (a NodeAddr that is a name) the address the kernel sends from towards node 0."""
    if _held(own):
        return own
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(master), 9))  # UDP: nothing is sent
            chosen = str(probe.getsockname()[0])
    except OSError as exc:
        raise AllocationError(f"node 0's address {master} does not resolve to a route here: {exc}") from None
    if ipaddress.ip_address(chosen).is_loopback:
        raise AllocationError(
            f"this node reaches node 0 ({master}) over loopback: set NodeAddr in slurm.conf to each "
            "node's network address"
        )
    return chosen


def _held(address: str) -> bool:
    return any(a.address == address for found in psutil.net_if_addrs().values() for a in found)


def interface_of(address: str) -> str:
    """The network interface holding `address` on this host (what GLOO_SOCKET_IFNAME names)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise AllocationError(
        f"no network interface of this node holds its Slurm address {address}: set NodeAddr in slurm.conf "
        "to an address of the node"
    )
