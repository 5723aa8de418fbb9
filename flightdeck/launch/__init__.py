"""The launch plan: the exact argv and environment of an attempt, each variable with its reason."""

from flightdeck.launch.plan import LaunchPlan, PlanError, build_launch_plan
from flightdeck.launch.variables import EnvVar

__all__ = ["EnvVar", "LaunchPlan", "PlanError", "build_launch_plan"]
