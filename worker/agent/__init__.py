"""The worker agent: registers a host, pulls attempts, launches torchrun, ships what the run writes."""
