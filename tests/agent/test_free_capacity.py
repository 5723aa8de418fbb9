"""What a worker claims with: one host's free indices, or a partition's nodes packed best-fit."""

from __future__ import annotations

from flightdeck.worker.agent.free_capacity import FreeCapacity, free_capacity


def test_one_host_offers_the_indices_no_attempt_holds_and_no_node_count() -> None:
    assert free_capacity([0, 1, 2, 3], 1, [([1, 3], 1)]) == FreeCapacity([0, 2], None)
    assert free_capacity([0, 1], 1, [([0, 1], 1)]) == FreeCapacity([], None)


def test_a_partition_runs_a_one_node_job_per_node_not_one_nodes_worth_in_all() -> None:
    """Two nodes of 2 slots: a 1-node job of 2 leaves the other node whole (once it held everything)."""
    assert free_capacity([0, 1], 2, []) == FreeCapacity([0, 1], 2)
    assert free_capacity([0, 1], 2, [([0, 1], 1)]) == FreeCapacity([0, 1], 1)
    assert free_capacity([0, 1], 2, [([0, 1], 1), ([0, 1], 1)]) == FreeCapacity([], 0)
    assert free_capacity([0, 1], 2, [([0, 1], 2)]) == FreeCapacity([], 0)


def test_small_attempts_are_packed_best_fit_leaving_whole_nodes_for_jobs_of_several() -> None:
    # 3 nodes of 8: two 1-node attempts of 4 share a node; two nodes stay whole for a 2-node job.
    assert free_capacity(list(range(8)), 3, [([0, 1, 2, 3], 1), ([0, 1, 2, 3], 1)]) == FreeCapacity(
        list(range(8)), 2
    )
    # A 2-node attempt of 2 per node takes two distinct nodes, never one node twice.
    assert free_capacity(list(range(8)), 2, [([0, 1], 2)]) == FreeCapacity(list(range(6)), 2)
    # 8 one-device attempts fill one node before touching the next.
    assert free_capacity(list(range(8)), 2, [([i], 1) for i in range(8)]) == FreeCapacity(list(range(8)), 1)


def test_more_held_than_the_partition_has_offers_nothing_and_never_a_negative_count() -> None:
    assert free_capacity([0, 1], 2, [([0, 1], 3), ([0, 1], 1)]) == FreeCapacity([], 0)
