"""Runs the static rules over a recipe and applies the corrections of 'fix' findings."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from flightdeck.memory.architecture import model_shape
from flightdeck.preflight.rule_result import Correction, RuleResult
from flightdeck.preflight.script_checks import argument_findings
from flightdeck.preflight.static_rules import STATIC_RULES
from flightdeck.preflight.vision_rules import trained_tower_quantised
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe
from flightdeck.recipe.validate import LAUNCH_KEYS, deep_merge, expand_stages


class PreflightResult(BaseModel):
    findings: list[Finding] = Field(default_factory=list)
    effective: Recipe

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Write `value` at a dotted recipe path such as 'model.device_map' or 'env.OMP_NUM_THREADS'."""
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def apply_changes(recipe: Recipe, changes: Mapping[str, Any]) -> Recipe:
    """The recipe with each dotted path set to its new value (re-validated)."""
    data = recipe.model_dump(mode="json")
    for path, value in changes.items():
        _set_path(data, path, value)
    return Recipe.model_validate(data)


def run_rules(
    recipe: Recipe, rules: Iterable[Callable[[Recipe], list[RuleResult]]]
) -> tuple[list[Finding], dict[str, Any]]:
    """Run rules in order, each on the recipe as corrected so far; (findings, all changes made)."""
    findings: list[Finding] = []
    changes: dict[str, Any] = {}
    current = recipe
    for rule in rules:
        for result in rule(current):
            if isinstance(result, Correction):
                findings.append(result.finding)
                if result.changes:
                    changes |= result.changes
                    current = apply_changes(current, result.changes)
            else:
                findings.append(result)
    return findings, changes


def _prefixed(finding: Finding, prefix: str) -> Finding:
    return finding.model_copy(update={"path": prefix + finding.path})


# Recipe fields every stage must share with the top level (parse_recipe refuses a stage that differs,
# P001): a fix to one is written at the top level and into each stage that sets it itself.
SHARED_PATHS = frozenset({"model.device_map"})

StageCheck = Callable[[int, Recipe], tuple[list[Finding], dict[str, Any]]]


def check_stages(recipe: Recipe, check: StageCheck) -> PreflightResult:
    """Run `check` on the recipe, or on each stage (paths prefixed, fixes written into that stage)."""
    if not recipe.stages:
        findings, changes = check(0, recipe)
        return PreflightResult(findings=findings, effective=apply_changes(recipe, changes))
    all_findings: list[Finding] = []
    data = recipe.model_dump(mode="json")
    shared: dict[str, Any] = {}
    for index, stage_recipe in enumerate(expand_stages(recipe)):
        findings, changes = check(index, stage_recipe)
        for finding in findings:
            # A launch finding (env, resources) concerns the job's one launch: its top-level path, once.
            launch = finding.path.split(".")[0] in LAUNCH_KEYS
            finding = finding if launch else _prefixed(finding, f"stages[{index}].")
            if finding not in all_findings:
                all_findings.append(finding)
        stage_patch: dict[str, Any] = {}
        for path, value in changes.items():
            # All stages share one launch, so a stage may not carry env/resources (the trainer refuses
            # it): a launch fix found in any stage is written once, at the top level.
            if path.split(".")[0] in LAUNCH_KEYS:
                _set_path(data, path, value)
            elif path in SHARED_PATHS:
                shared[path] = value
            else:
                _set_path(stage_patch, path, value)
        data["stages"][index] = deep_merge(data["stages"][index], stage_patch)
    for path, value in shared.items():
        # The process layout is the launch's: the top level and every stage that names it agree (P001).
        _set_path(data, path, value)
        for stage in data["stages"]:
            if _has_path(stage, path):
                _set_path(stage, path, value)
    return PreflightResult(findings=all_findings, effective=Recipe.model_validate(data))


def _has_path(data: dict[str, Any], path: str) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def run_static_preflight(recipe: Recipe, *, model_config: Mapping[str, Any] | None = None) -> PreflightResult:
    """Findings for `recipe` and the effective recipe with every 'fix' applied (and recorded).

    A recipe with stages is checked stage by stage (paths prefixed `stages[i].`) and each
    stage's corrections are written into that stage. `model_config` (config.json as a dict)
    enables the rules that need the model's shape (G001 over real names, D006).
    """
    shape = model_shape(model_config) if model_config else None
    rules = [lambda r, rule=rule: rule(r, shape) for rule in STATIC_RULES]
    stages = expand_stages(recipe)

    def check(index: int, stage: Recipe) -> tuple[list[Finding], dict[str, Any]]:
        previous = stages[index - 1] if index > 0 else None
        return run_rules(stage, [*rules, lambda r: trained_tower_quantised(r, previous)])

    result = check_stages(recipe, check)
    # A script job: the same rules over what its HF arguments say (--bf16, --per_device_train_batch_size).
    result.findings += argument_findings(recipe, rules)
    return result
