"""Every recipe in examples/ passes static and host preflight on the tiny demo workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightdeck.inventory import WorkerInventory
from flightdeck.preflight import run_static_preflight
from flightdeck.recipe import parse_recipe
from flightdeck.worker.host_preflight import run_host_preflight
from flightdeck.worker.tiny import make_demo_workspace

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.json"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_workspace(tmp_path_factory.mktemp("workspace"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_preflight(path: Path, workspace: Path) -> None:
    recipe = parse_recipe(json.loads(path.read_text()))
    static = run_static_preflight(recipe)
    assert [f for f in static.findings if f.severity == "error"] == []
    inventory = WorkerInventory(
        cpu_slots=2, cores=2, workspace=str(workspace), runs_dir=str(workspace / "runs")
    )
    host = run_host_preflight(static.effective, inventory, workspace, [0, 1])
    assert [(f.code, f.path, f.message) for f in host.findings if f.severity == "error"] == []
    # Fixes never produce a recipe the trainer refuses (a stage may not carry env: E004 once broke R2).
    for effective in (static.effective, host.effective):
        parse_recipe(effective.model_dump(mode="json"))


def test_a_launch_fix_found_in_every_stage_is_one_top_level_finding() -> None:
    recipe = parse_recipe(json.loads((EXAMPLES[0].parent / "r2-two-stage.json").read_text()))
    e004 = [f for f in run_static_preflight(recipe).findings if f.code == "E004"]
    assert [f.path for f in e004] == ["env.TOKENIZERS_PARALLELISM"]
