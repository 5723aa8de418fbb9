"""Where an attempt runs: in the agent's own process (`inprocess`) or as a job of a cluster scheduler
(`slurm`). What runs is always the same attempt runner (worker/agent/attempt.py)."""
