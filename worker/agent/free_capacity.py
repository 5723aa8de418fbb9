"""What a worker has free to claim with: its devices on one host, or, for a worker whose scheduler
places jobs on several nodes (a Slurm partition), the devices and nodes its running attempts leave.

One host: the indices no running attempt holds. Several nodes: the scheduler, not Flightdeck, decides
where each attempt runs, so the worker keeps a count per node, as if its attempts were packed onto
the nodes best-fit (each of an attempt's nodes on the fullest node that still has room), which keeps
whole nodes free for jobs of several nodes. It claims with the devices of the emptiest node and the
number of nodes with that many free; the service gives it only a job of at most that many nodes.
That is conservative (a job asking fewer devices per node might fit on more nodes) and never offers
more than the partition holds; where others' jobs share the partition, Slurm queues what does not
fit and the job page shows its pending reason.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FreeCapacity:
    devices: list[int]  # device indices (or CPU slots) free on one node
    nodes: int | None  # how many nodes have them free; None: a worker of one host


def free_capacity(indices: list[int], nodes: int, held: list[tuple[list[int], int]]) -> FreeCapacity:
    """`indices`: one node's devices as registered; `nodes`: the worker's nodes; `held`: each running
    attempt's (devices per node, nodes)."""
    if nodes <= 1:
        taken = {d for devices, _ in held for d in devices}
        return FreeCapacity([d for d in indices if d not in taken], None)
    free = [len(indices)] * nodes
    # Biggest first: packing them before the small ones leaves the fewest nodes part-used.
    for devices, count in sorted(held, key=lambda h: (len(h[0]), h[1]), reverse=True):
        need, used = len(devices), set[int]()
        for _ in range(min(count, nodes)):
            others = [n for n in range(nodes) if n not in used]  # an attempt's nodes are distinct nodes
            fitting = [n for n in others if free[n] >= need]
            # Best fit; none with room (more held than the partition has, e.g. adopted after a change
            # of the partition): the emptiest node, never below zero.
            node = min(fitting, key=lambda n: free[n]) if fitting else max(others, key=lambda n: free[n])
            free[node] = max(free[node] - need, 0)
            used.add(node)
    most = max(free)
    return FreeCapacity(indices[:most], sum(1 for f in free if f == most) if most else 0)
