"""POST /preflight: static rules, host rules for a described worker, and the memory estimate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from flightdeck.inventory import WorkerInventory, notional_inventory
from flightdeck.launch.plan import LaunchPlan, PlanError, build_launch_plan, plan_findings
from flightdeck.memory.architecture import ModelShape, model_shape
from flightdeck.memory.estimate import estimate_memory, missing_for_estimate
from flightdeck.preflight.engine import apply_changes, check_stages, run_rules, run_static_preflight
from flightdeck.preflight.host_rules import HOST_RULES, HostRule
from flightdeck.preflight.rule_result import RuleResult
from flightdeck.preflight.script_checks import argument_findings, estimated_recipe
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe
from flightdeck.recipe.validate import expand_stages


class DryRun(BaseModel):
    """What a dry run answers; `memory` is a GB breakdown per stage, or the reason it is unknown.

    `plan` is the launch plan the claim would build for this recipe on the described worker (or on a
    notional one that fits exactly): built from the same effective recipe a submitted job stores, so
    the preview is the plan that runs.
    """

    findings: list[Finding] = Field(default_factory=list)
    effective: Recipe
    memory: list[dict[str, Any]] | str
    plan: LaunchPlan | None = None
    plan_on: str = ""
    plan_error: str | None = None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


def run_inventory_rules(
    recipe: Recipe, inventory: WorkerInventory, devices: list[int], shape: ModelShape | None
) -> tuple[list[Finding], Recipe]:
    """Host rules that need only the inventory (and the model's shape); (findings, corrected recipe)."""
    rules = [lambda r, rule=rule: rule(r, inventory, devices, shape) for rule in HOST_RULES]
    findings, changes = run_rules(recipe, rules)
    return findings, apply_changes(recipe, changes)


def preflight_for_host(
    recipe: Recipe,
    inventory: WorkerInventory | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> DryRun:
    """Dry run of `recipe` on a described worker (if any); `model_config` is the first stage's config.json."""
    static = run_static_preflight(recipe, model_config=model_config)
    shape = model_shape(model_config) if model_config else None
    findings, effective = list(static.findings), static.effective
    plan, plan_on, plan_error = _plan_preview(static.effective, inventory)
    if plan is not None:
        findings += plan_findings(plan)
    if inventory is not None:

        def check(_: int, stage: Recipe) -> tuple[list[Finding], dict[str, Any]]:
            rules = [lambda r, rule=rule: rule(r, inventory, [], shape) for rule in HOST_RULES]
            return run_rules(stage, rules)

        host = check_stages(effective, check)
        findings += host.findings
        effective = host.effective
        findings += argument_findings(effective, [_bound(rule, inventory, shape) for rule in HOST_RULES])
    estimated = estimated_recipe(effective)  # a script job: as its HF arguments describe it
    missing = missing_for_estimate(estimated)
    if missing:
        memory: list[dict[str, Any]] | str = (
            f"unknown: the script job does not declare {', '.join(missing)} (declare them, or pass the HF "
            "arguments --model_name_or_path and --per_device_train_batch_size, to estimate memory)"
        )
    elif model_config is None:
        memory = "unknown: pass the model's config.json as model_config"
    elif shape is None:
        memory = f"unknown: model_type '{model_config.get('model_type')}' is not one the estimator models"
    else:
        memory = [estimate_memory(stage, shape).summary() for stage in expand_stages(estimated)]
    return DryRun(
        findings=findings,
        effective=effective,
        memory=memory,
        plan=plan,
        plan_on=plan_on,
        plan_error=plan_error,
    )


def _bound(
    rule: HostRule, inventory: WorkerInventory, shape: ModelShape | None
) -> Callable[[Recipe], list[RuleResult]]:
    return lambda recipe: rule(recipe, inventory, [], shape)


def _plan_preview(
    recipe: Recipe, inventory: WorkerInventory | None
) -> tuple[LaunchPlan | None, str, str | None]:
    """(plan, what it was built for, why it could not be): the claim's own build_launch_plan."""
    resources = recipe.resources
    if inventory is None:
        target = notional_inventory(resources.gpus_per_node, resources.accelerator, resources.gpu_memory_gb)
        plan_on = (
            f"a notional worker with exactly the devices the recipe asks for, not a real host: {target.facts()}; "
            "describe a host (or run `flightdeck preflight --workspace DIR` on it) to plan for its facts"
        )
    else:
        target, plan_on = inventory, f"the described worker '{inventory.hostname}': {inventory.facts()}"
    devices = list(range(min(target.device_count, resources.gpus_per_node)))
    try:
        # A preview is of no job and no database: job 0, in a run directory under `preview/`.
        plan = build_launch_plan(
            recipe, target, job_id=0, attempt_number=1, devices=devices, database="preview"
        )
        return plan, plan_on, None
    except PlanError as exc:
        return None, plan_on, str(exc)
