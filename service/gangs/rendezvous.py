"""Where a gang meets: node 0 is the first member whose address the others can reach (N001 when
none can)."""

from __future__ import annotations

import ipaddress

from sqlalchemy import Connection

from flightdeck.inventory import WorkerInventory
from flightdeck.service.core.tables import attempt_nodes
from flightdeck.service.lifecycle import change_nodes, fail_unlaunchable
from flightdeck.statuses import NodeStatus


def rendezvous_order(inventories: list[WorkerInventory]) -> list[int] | None:
    """Join order, with node 0 moved to the first member whose address the others can reach (N001);
    None when there is none. Members all on one host reach each other on any address, loopback too."""
    if len({inv.hostname for inv in inventories}) == 1:
        return list(range(len(inventories)))
    reachable = [i for i, inv in enumerate(inventories) if not _local_only(inv.address)]
    if not reachable:
        return None
    return [reachable[0], *(i for i in range(len(inventories)) if i != reachable[0])]


def _local_only(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address in ("", "localhost")  # a host name: the other hosts resolve it (not checked here)
    return ip.is_loopback or ip.is_unspecified or ip.is_link_local


def fail_unreachable(
    conn: Connection,
    job_id: int,
    names: list[str],
    inventories: list[WorkerInventory],
    now: float,
    gang_wait: float,
) -> None:
    """N001: the gang spans hosts and no member registered an address the others can reach."""
    seen = ", ".join(
        f"{name} ({inv.hostname}: {inv.address})" for name, inv in zip(names, inventories, strict=True)
    )
    message = (
        f"N001: the nodes are on different hosts and none registered an address the others can reach "
        f"({seen}); torchrun's rendezvous would wait for peers that never arrive"
    )
    change_nodes(
        conn,
        attempt_nodes.c.job_id == job_id,
        [NodeStatus.waiting],
        NodeStatus.released,
        {"until": now + gang_wait},
    )
    fail_unlaunchable(
        conn,
        job_id,
        code="N001",
        message=message,
        fix="start each worker with --address (FLIGHTDECK_WORKER_ADDRESS) set to an address of its host "
        "that the other hosts reach, then submit the job again",
        now=now,
    )
