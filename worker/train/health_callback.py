"""HealthMonitor registered with a Trainer: the recipe trainer's, and any test's that drives a Trainer.

Its own module so that health.py stays free of transformers' trainer (a plain loop's ranks and the
agent's host check import HealthMonitor; worker/script_run.py says what the trainer module costs).
"""

from __future__ import annotations

from transformers import TrainerCallback

from flightdeck.worker.train.health import HealthMonitor


class HealthCallback(HealthMonitor, TrainerCallback):
    """HealthMonitor's hooks for the events it judges; TrainerCallback's no-ops for every other event
    the Trainer calls on each of its callbacks."""
