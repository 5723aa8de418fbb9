"""run_host_preflight: every host rule, run by the agent before torchrun starts (its one entry point)."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flightdeck.inventory import WorkerInventory
from flightdeck.memory.architecture import ModelShape, model_shape
from flightdeck.preflight.engine import PreflightResult, check_stages, run_rules
from flightdeck.preflight.host_rules import HOST_RULES, HostRule
from flightdeck.preflight.rule_result import RuleResult, error
from flightdeck.preflight.script_checks import argument_findings
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import PREVIOUS_STAGE, Recipe
from flightdeck.recipe.script_args import described_recipe
from flightdeck.worker.host_preflight.cuda_on_cpu import cuda_on_cpu_findings
from flightdeck.worker.host_preflight.data_rules import check_data
from flightdeck.worker.host_preflight.entrypoint import entrypoint_findings
from flightdeck.worker.host_preflight.environment import inherited_launcher_env, master_port_in_use
from flightdeck.worker.host_preflight.loss_normalisation import accumulation_without_loss_kwargs
from flightdeck.worker.host_preflight.model_probe import (
    MODEL_RULES,
    ModelProbe,
    image_text_processor,
    missing_pad_token,
    probe_model,
    tower_trains,
)
from flightdeck.worker.host_preflight.requirements import requirements_findings
from flightdeck.worker.host_preflight.vocabulary_rules import tokens_beyond_embeddings
from flightdeck.worker.path_confinement import model_location

# Catalog round three (G013, G015): model-probe rules kept apart from MODEL_RULES.
PROBE_RULES = (tokens_beyond_embeddings, accumulation_without_loss_kwargs)


_MODEL_FIX = "give a local model directory (relative to the workspace) or a hub id in the worker's cache"


def _missing_local_model(recipe: Recipe, workspace: Path) -> RuleResult | None:
    """A path whose folder exists in the workspace but not the model itself (`models/tiny-lama`): a typo,
    not a hub id; name the nearest models instead of the hub's connection error."""
    path = Path(recipe.need_model().path)
    if path.is_absolute() or len(path.parts) < 2:
        return None
    parent = workspace / path.parent
    if not parent.is_dir() or (workspace / path).exists():
        return None
    if not parent.resolve().is_relative_to(workspace.resolve()):
        return None  # never list a folder outside the workspace (S001 reports such paths)
    names = sorted(p.name for p in parent.iterdir() if p.is_dir())
    near = difflib.get_close_matches(path.name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(str(path.parent / n)) for n in near)}?" if near else ""
    listed = ", ".join(names[:10]) or "none"
    return error(
        "P008",
        "model.path",
        f"'{recipe.model.path}' does not exist under the workspace ({path.parent}/ holds: {listed}){hint}",
        "host",
        f"set model.path to {str(path.parent / near[0])!r}" if near else _MODEL_FIX,
    )


def _unreadable_model(recipe: Recipe, exc: Exception, workspace: Path) -> RuleResult:
    missing = _missing_local_model(recipe, workspace)
    if missing is not None:
        return missing
    return error(
        "P008",
        "model.path",
        f"cannot read the model at '{recipe.model.path}' ({type(exc).__name__}: {str(exc)[:300]}); "
        "give a local model directory (relative to the workspace) or a reachable hub id.",
        "host",
        _MODEL_FIX,
    )


def _bind_host(
    rule: HostRule, inventory: WorkerInventory, devices: list[int], shape: ModelShape | None
) -> Callable[[Recipe], list[RuleResult]]:
    return lambda recipe: rule(recipe, inventory, devices, shape)


def _argument_model_shape(recipe: Recipe, workspace: Path) -> ModelShape | None:
    """The shape of the model a script job's `--model_name_or_path` names, when its config.json is on this
    host; None otherwise (a hub id not cached, or arguments that are not the HF ones)."""
    try:
        described = described_recipe(recipe)
    except ValueError:
        return None  # argument_findings names the argument
    if described is None or described[0].model is None:
        return None
    location = model_location(described[0].need_model().path, workspace)
    if not isinstance(location, Path):
        return None  # a hub id: never read relative to the agent's own directory
    try:
        return model_shape(json.loads((location / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _bind_model(
    rule: Callable[[Recipe, ModelProbe], list[RuleResult]], probe: ModelProbe
) -> Callable[[Recipe], list[RuleResult]]:
    return lambda recipe: rule(recipe, probe)


def run_host_preflight(
    recipe: Recipe,
    inventory: WorkerInventory,
    workspace: str | Path,
    devices: list[int],
    *,
    environ: Mapping[str, str] | None = None,
) -> PreflightResult:
    """Host findings (stage by stage, paths prefixed like the static ones) and `effective`, the recipe
    with the host fixes applied."""
    root = Path(workspace or ".")
    probes: list[ModelProbe | None] = []

    def check(index: int, stage: Recipe) -> tuple[list[Finding], dict[str, Any]]:
        results: list[RuleResult] = entrypoint_findings(stage, root) or cuda_on_cpu_findings(
            stage, inventory, root
        )
        results += requirements_findings(stage, root)
        probe: ModelProbe | None = None
        if stage.model is None:
            pass  # a script job that does not describe its model: the model rules cannot run
        elif stage.model.path == PREVIOUS_STAGE:
            probe = probes[index - 1] if index > 0 else None  # the previous output keeps the architecture
        else:
            try:
                probe = probe_model(stage, root)
            except Exception as exc:  # any loader failure is the user's model path or files
                results.append(_unreadable_model(stage, exc, root))
        probes.append(probe)
        shape = model_shape(probe.config) if probe else None
        rules: list[Callable[[Recipe], list[RuleResult]]] = [lambda _: results]
        # G011 writes the embeddings a new pad token trains into adapter.modules_to_save: before the
        # host rules, so the memory estimate (M001) counts them.
        if probe is not None:
            rules.append(_bind_model(missing_pad_token, probe))
        rules += [_bind_host(rule, inventory, devices, shape) for rule in HOST_RULES]
        if probe is not None:
            rules += [_bind_model(rule, probe) for rule in MODEL_RULES if rule is not missing_pad_token]
            rules += [_bind_model(rule, probe) for rule in PROBE_RULES]
        tokenizer = probe.tokenizer if probe else None
        processor = image_text_processor(probe)
        tower = tower_trains(stage, probe)
        if stage.data is not None:
            rules.append(lambda r: check_data(r, root, tokenizer, processor=processor, tower_trains=tower))
        rules.append(master_port_in_use)
        if stage.entrypoint is not None:
            # A script job: the host rules over what its HF arguments say, against this host's real GPUs
            # (M001 with their memory, X001 for --bf16), as the dry run does against a described host.
            described_shape = _argument_model_shape(stage, root)
            host = [_bind_host(rule, inventory, devices, described_shape) for rule in HOST_RULES]
            rules.append(lambda r: list(argument_findings(r, host)))
        return run_rules(stage, rules)

    result = check_stages(recipe, check)
    inherited = inherited_launcher_env(os.environ if environ is None else environ)
    result.findings += [o.finding if not isinstance(o, Finding) else o for o in inherited]
    return result
