"""Recipe paths confined to the worker's allowed roots (S001): no `..`, absolute path or symlink leads out.

A recipe names files on the worker (model.path, data.train[i].path, data.eval[i].path, a script
job's entrypoint, which must be in the workspace itself) and the agent writes the run directory; each must resolve, symlinks followed, inside one of the allowed
roots: the worker's workspace plus any extra roots the worker is configured with. Relative paths
resolve against the workspace, as the trainer resolves them. A model.path that is not a local
directory and is not absolute is a hub id and is left alone; `@previous` is a stage's output.

The agent calls it in host preflight, before launch, and fails the attempt as `preflight` on an
error finding, like any other host rule (the runs directory is a root when it is outside the
workspace, since the operator chose it):

    from worker.path_confinement import confinement_findings
    findings = confinement_findings(
        recipe, inventory.workspace, extra_roots=[inventory.runs_dir, *settings.extra_roots],
        run_dir=plan.run_dir,
    )
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from service.recipe import Finding, Recipe, expand_stages
from service.recipe.schema import PREVIOUS_STAGE

CODE = "S001"


def allowed_roots(workspace: str | Path, extra_roots: Iterable[str | Path] = ()) -> list[Path]:
    """The workspace and the extra roots, symlinks resolved, in that order."""
    return [Path(os.path.realpath(root)) for root in [workspace, *extra_roots]]


def resolve_inside(path: str | Path, workspace: str | Path, roots: Sequence[Path]) -> Path | None:
    """Where `path` really leads (relative to the workspace), or None when that is outside every root."""
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = Path(workspace) / candidate
    # realpath follows every symlink that exists and folds `..` after it, as the kernel would.
    real = Path(os.path.realpath(candidate))
    return real if any(real == root or real.is_relative_to(root) for root in roots) else None


def _escapes_through_entries(directory: Path, roots: Sequence[Path]) -> Path | None:
    """A symlink anywhere under `directory` (a dataset directory) leading out, if any, relative to it.

    Anywhere, not only directly inside: `datasets` reads a Hub snapshot's `data/` shards and `<split>/`
    folders, so a link in a subfolder is read as surely as one at the top."""
    for current, folders, files in os.walk(directory, followlinks=False):
        for name in sorted(folders + files):
            entry = Path(current) / name
            if entry.is_symlink() and resolve_inside(entry, current, roots) is None:
                return entry.relative_to(directory)
    return None


_RECIPE_FIX = (
    "put the files under one of them and give a path relative to the workspace, "
    "or start the worker with their directory as an extra allowed root"
)
_RUN_DIR_FIX = "give the worker a runs directory inside its allowed roots and remove any symlink leading out"


def _refusal(recipe_path: str, given: str, roots: Sequence[Path], what: str) -> Finding:
    # Where it leads is not said: the message must not reveal what lies outside the roots.
    listed = ", ".join(str(root) for root in roots)
    fix = _RUN_DIR_FIX if recipe_path == "run_dir" else _RECIPE_FIX
    return Finding(
        code=CODE,
        severity="error",
        path=recipe_path,
        where="host",
        message=f"{what} '{given[:300]}' leads outside the worker's allowed roots ({listed}); {fix}",
    )


def _check(
    recipe_path: str, given: str, workspace: str | Path, roots: Sequence[Path], what: str
) -> list[Finding]:
    real = resolve_inside(given, workspace, roots)
    if real is None:
        return [_refusal(recipe_path, given, roots, what)]
    if real.is_dir():
        # A split directory is read file by file: a link inside it must not lead out either.
        entry = _escapes_through_entries(real, roots)
        if entry is not None:
            return [_refusal(recipe_path, f"{given}/{entry}", roots, what)]
    return []


# A hub id is `name` or `org/name`; anything else is a path, and a path is read under the roots only.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def is_hub_id(given: str, workspace: str | Path) -> bool:
    """`org/name` shaped, and nothing by that name in the workspace: never a filesystem read."""
    if not HUB_ID.fullmatch(given) or ".." in given.split("/"):
        return False
    return not os.path.lexists(os.path.join(workspace, given))


def _stage_paths(stage: Recipe) -> list[tuple[str, str, str]]:
    """(recipe path, value, what) of every local path one stage names."""
    found: list[tuple[str, str, str]] = []
    if stage.model is not None and stage.model.path != PREVIOUS_STAGE:
        found.append(("model.path", stage.model.path, "the model path"))
    for split in ("train", "eval"):
        for index, source in enumerate(getattr(stage.data, split) if stage.data is not None else []):
            found.append((f"data.{split}[{index}].path", source.path, "the data path"))
    return found


def module_file(module: str, workspace: str | Path) -> Path:
    """The file `python -m module` runs from the workspace: a.b -> a/b.py, or a/b/__main__.py."""
    base = Path(workspace, *module.split("."))
    package_main = base / "__main__.py"
    return package_main if package_main.exists() else base.with_suffix(".py")


def _entrypoint_findings(recipe: Recipe, workspace: str | Path) -> list[Finding]:
    """A script job's program must be a file in the workspace itself: extra roots hold data, not code."""
    entry = recipe.entrypoint
    if entry is None:
        return []
    root = allowed_roots(workspace)
    if entry.script is not None:
        return _check("entrypoint.script", entry.script, workspace, root, "the script")
    assert entry.module is not None
    program = module_file(entry.module, workspace)
    if not os.path.lexists(program):
        return []  # host preflight says it is missing; nothing leads anywhere
    return _check("entrypoint.module", str(program), workspace, root, "the module's file")


def confinement_findings(
    recipe: Recipe,
    workspace: str | Path,
    *,
    extra_roots: Iterable[str | Path] = (),
    run_dir: str | Path | None = None,
) -> list[Finding]:
    """S001 errors for every recipe path (and the run directory) that leads outside the allowed roots."""
    roots = allowed_roots(workspace, extra_roots)
    stages = expand_stages(recipe)
    findings: list[Finding] = _entrypoint_findings(recipe, workspace)
    for index, stage in enumerate(stages):
        prefix = f"stages[{index}]." if recipe.stages else ""
        for recipe_path, given, what in _stage_paths(stage):
            if recipe_path == "model.path" and is_hub_id(given, workspace):
                continue
            findings += _check(prefix + recipe_path, given, workspace, roots, what)
    if run_dir is not None:
        # Its entries are checked too, so an `output` symlink leading out is caught with it.
        findings += _check("run_dir", str(run_dir), workspace, roots, "the run directory")
    return findings
