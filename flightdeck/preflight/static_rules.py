"""The static rule catalog, in the order the engine runs it (earlier fixes are seen by later rules)."""

from __future__ import annotations

from flightdeck.preflight.environment_rules import ENVIRONMENT_RULES
from flightdeck.preflight.gradient_rules import GRADIENT_RULES
from flightdeck.preflight.parallelism_rules import PARALLELISM_RULES
from flightdeck.preflight.rule_result import StaticRule
from flightdeck.preflight.script_arg_rules import SCRIPT_ARG_RULES
from flightdeck.preflight.vision_rules import VISION_RULES

STATIC_RULES: tuple[StaticRule, ...] = (
    *PARALLELISM_RULES,
    *GRADIENT_RULES,
    *ENVIRONMENT_RULES,
    *VISION_RULES,
    *SCRIPT_ARG_RULES,
)
