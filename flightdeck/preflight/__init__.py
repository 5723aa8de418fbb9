"""Preflight: the failure catalog (docs/failures.md) as rules run on a recipe (static) or on a host.

Entry points (signatures are the contract for the API and the agent):

    run_static_preflight(recipe: Recipe, *, model_config: Mapping[str, Any] | None = None) -> PreflightResult
        POST /jobs: findings (error/fix/warn) and `effective`, the recipe with every fix applied.
        Stages are checked one by one (finding paths 'stages[i]....', fixes written into that stage).
    preflight_for_host(recipe: Recipe, inventory: WorkerInventory | None = None,
                       model_config: Mapping[str, Any] | None = None) -> DryRun
        POST /preflight: static findings + host findings for the described inventory (GPU count and
        capability, cores, P2P, memory vs estimate) + `memory`, a list of per-stage GB breakdowns, or a
        string saying why it is unknown (no model_config given, or an architecture we do not model).
        DryRun.model_dump(mode="json") is the answer body; DryRun.ok is False when any finding is an error.
    run_inventory_rules(recipe, inventory, devices: list[int], shape: ModelShape | None)
        -> tuple[list[Finding], Recipe]: the host rules that need only the inventory (the agent's
        flightdeck.worker.host_preflight.run_host_preflight adds the file, model, port and environment rules).
    apply_changes(recipe, {"model.device_map": None, ...}) -> Recipe
"""

from flightdeck.preflight.dry_run import DryRun, preflight_for_host, run_inventory_rules
from flightdeck.preflight.engine import PreflightResult, apply_changes, run_static_preflight
from flightdeck.preflight.rule_result import Correction, RuleResult

__all__ = [
    "Correction",
    "DryRun",
    "PreflightResult",
    "RuleResult",
    "apply_changes",
    "preflight_for_host",
    "run_inventory_rules",
    "run_static_preflight",
]
