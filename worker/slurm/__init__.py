"""The Slurm executor: Flightdeck's claimed attempts as Slurm batch jobs (docs/slurm.md)."""
