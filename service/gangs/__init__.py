"""Gangs: every attempt's nodes, and multi-node jobs whose N workers gather, become the N nodes of one
attempt, and end it together.

Every attempt is a gang: a claim by a worker that places all of a job's nodes itself (one for a
single-node job; N for a Slurm partition) writes the attempt with every node row held by that worker
(service/claims.py), and those rows carry the leases, the ends and the cause as a gang's do. Only a
worker that places fewer nodes than the job needs gathers with others, as below.

The life of a job with `resources.nodes: N` (rows of attempt_nodes, one per worker):
1. gather: a worker whose claim picks the job joins its gang (`waiting`, until now + gang_wait). The
   job stays queued, so the next worker's claim picks it too. A job is not joined while fewer than N
   workers are alive: nothing could fill it, and the worker takes the next job instead.
2. fill: the claim that brings the N-th live member creates the attempt, gives node ranks in join order,
   builds each node's plan (static rendezvous at node 0's registered address) and moves the job to
   running. The members still long-polling get their node from their next claim (`assigned` ->
   `running`); the claim route wakes them.
3. release: a member whose gang has not filled by its `until` is released and skips that job for
   another gang_wait, so single-node jobs behind it run and the worker is never held for good.
4. start together: each node's agent runs host preflight and reports ready (node 0 with the port it
   found free); torchrun starts on a node only when every node is ready (`ready_state`).
5. end together: each node reports its own finish. A node that failed, was cancelled or lost its lease
   makes the heartbeat stop every other node; the attempt ends once every node has ended, as one
   attempt, with the first failed node's cause (its rank and worker named).

In a gang of hosts a worker holds one node of an attempt; a worker whose scheduler places the nodes
holds all of them. Either way (attempt, worker) names the worker's share, which it renews and ends.

Its modules, one concern each: `gather` (joining, filling, releasing; the claim's answer for a node),
`rendezvous` (node 0 where the others reach it, N001), `barrier` (the start barrier), `nodes` (a
filled gang's nodes: who holds which, stopping together, ending as one attempt), `node_leases`
(each node's lease). The statuses of a node row are flightdeck/statuses.py's `NodeStatus`.
"""
