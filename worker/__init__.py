"""Flightdeck data plane: the worker agent and the trainer that torchrun runs."""
