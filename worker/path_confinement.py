"""Recipe paths confined to the worker's allowed roots (S001): no `..`, absolute path or symlink leads out.

A recipe names files on the worker (model.path, data.train[i].path, data.eval[i].path, a script
job's entrypoint, which must be in the workspace itself) and the agent writes the run directory; each must resolve, symlinks followed, inside one of the allowed
roots: the worker's workspace plus any extra roots the worker is configured with. Relative paths
resolve against the workspace, as the trainer resolves them. A model.path that is not a local
directory and is not absolute is a hub id and is left alone; `@previous` is a stage's output.

The agent calls it in host preflight, before launch, and fails the attempt as `preflight` on an
error finding, like any other host rule (the runs directory is a root when it is outside the
workspace, since the operator chose it):

    from flightdeck.worker.path_confinement import confinement_findings
    findings = confinement_findings(
        recipe, inventory.workspace, extra_roots=[inventory.runs_dir, *settings.extra_roots],
        run_dir=plan.run_dir,
    )
"""

from __future__ import annotations

import os
import re
import site
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from flightdeck.contracts import SERVICE_DATA_MARKER
from flightdeck.recipe import Finding, Recipe, expand_stages
from flightdeck.recipe.schema import PREVIOUS_STAGE

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
        fix=fix,
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


def model_location(given: str, workspace: str | Path) -> Path | str:
    """Where a recipe's model.path is, for the host check and the trainer alike: a local directory
    (relative paths resolve against the workspace only) or a hub id.

    Anything that is not `org/name` shaped stays a path under the workspace even when it does not exist
    (loading it then fails with the nearest names), so nothing is read relative to wherever the process
    happens to run. transformers reads a directory of a hub id's name relative to the process's
    directory first: a hub id that something there shadows is the missing workspace path instead.
    """
    path = Path(given)
    local = path if path.is_absolute() else Path(workspace) / path
    if local.is_dir():
        return local
    if is_hub_id(given, workspace) and not os.path.lexists(given):
        return given
    return local


def _stage_paths(stage: Recipe) -> list[tuple[str, str, str]]:
    """(recipe path, value, what) of every local path one stage names."""
    found: list[tuple[str, str, str]] = []
    if stage.model is not None and stage.model.path != PREVIOUS_STAGE:
        found.append(("model.path", stage.model.path, "the model path"))
    for split in ("train", "eval"):
        for index, source in enumerate(getattr(stage.data, split) if stage.data is not None else []):
            found.append((f"data.{split}[{index}].path", source.path, "the data path"))
    return found


def recipe_paths(recipe: Recipe) -> list[tuple[str, str]]:
    """(recipe path, value) of every local path the recipe's stages name: model directories, data."""
    return [(where, given) for stage in expand_stages(recipe) for where, given, _ in _stage_paths(stage)]


def module_file(module: str, workspace: str | Path) -> Path:
    """The file `python -m module` runs from the workspace: a.b -> a/b.py, or a/b/__main__.py."""
    base = Path(workspace, *module.split("."))
    package_main = base / "__main__.py"
    return package_main if package_main.exists() else base.with_suffix(".py")


def _service_data_dir(real: Path) -> Path | None:
    """The nearest directory at or above `real` that is a Flightdeck service's data directory."""
    for directory in (real, *real.parents):
        if (directory / SERVICE_DATA_MARKER).exists():
            return directory
    return None


def code_free_roots(runs_dir: str | Path | None = None) -> list[tuple[Path, str]]:
    """Directories no script job's program may come from, each with what it is.

    Every file there is code someone else wrote for another purpose (torchrun, pip, Flightdeck itself)
    or output a run wrote: as an entrypoint it is a gadget that turns a job's args into a shell.
    """
    roots: list[tuple[Path, str]] = []
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.append((Path(os.path.realpath(prefix)), "the Python environment the worker runs in"))
    for packages in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.append((Path(os.path.realpath(packages)), "installed Python packages"))
    # An editable install keeps Flightdeck's own code outside site-packages.
    for package in ("flightdeck", "flightdeck.service", "flightdeck.worker", "flightdeck.cli"):
        module = sys.modules.get(package)
        location = getattr(module, "__file__", None)
        if location:
            roots.append((Path(os.path.realpath(location)).parent, "Flightdeck's own code"))
    if runs_dir is not None:
        roots.append((Path(os.path.realpath(runs_dir)), "the runs directory (what jobs wrote)"))
    return roots


def _code_refusal(recipe_path: str, given: str, why: str) -> Finding:
    return Finding(
        code=CODE,
        severity="error",
        path=recipe_path,
        where="host",
        message=f"the program '{given[:300]}' lies in {why}; a script job runs only the team's own "
        "training code from the workspace",
        fix="put the training script in the workspace (outside dot-directories, the runs directory and "
        "the Python environment) and name it from there",
    )


def _program_findings(
    recipe_path: str,
    given: str,
    real: Path,
    workspace: str | Path,
    runs_dir: str | Path | None,
    scripts_dir: str | Path | None,
) -> list[Finding]:
    """Where a program that is inside the workspace may still not be run from (docs/own-script.md)."""
    root = Path(os.path.realpath(workspace))
    inside = real.relative_to(root).parts if real.is_relative_to(root) else real.parts
    if any(part.startswith(".") for part in (*Path(given).parts, *inside)):
        return [_code_refusal(recipe_path, given, "a dot-directory (virtualenvs, tool state, caches)")]
    for code_root, what in code_free_roots(runs_dir):
        if real == code_root or real.is_relative_to(code_root):
            return [_code_refusal(recipe_path, given, what)]
    if _service_data_dir(real) is not None:
        return [_code_refusal(recipe_path, given, "the Flightdeck service's data directory")]
    if scripts_dir is not None:
        allowed = Path(os.path.realpath(Path(workspace) / scripts_dir))
        if not real.is_relative_to(allowed):
            return [
                _code_refusal(recipe_path, given, f"no part of this worker's scripts directory ({allowed})")
            ]
    return []


def _entrypoint_findings(
    recipe: Recipe,
    workspace: str | Path,
    runs_dir: str | Path | None = None,
    scripts_dir: str | Path | None = None,
) -> list[Finding]:
    """A script job's program must be a file in the workspace itself: extra roots hold data, not code,
    and no program may come from where others' code or a run's output lies."""
    entry = recipe.entrypoint
    if entry is None:
        return []
    root = allowed_roots(workspace)
    if entry.script is not None:
        recipe_path, given, what = "entrypoint.script", entry.script, "the script"
    else:
        assert entry.module is not None
        program = module_file(entry.module, workspace)
        if not os.path.lexists(program):
            return []  # host preflight says it is missing; nothing leads anywhere
        recipe_path, given, what = "entrypoint.module", str(program), "the module's file"
    real = resolve_inside(given, workspace, root)
    if real is None:
        return [_refusal(recipe_path, given, root, what)]
    findings = _program_findings(recipe_path, given, real, workspace, runs_dir, scripts_dir)
    if entry.requirements is not None and resolve_inside(entry.requirements, workspace, root) is None:
        # pip reads it and what it names (local paths, find-links) from the workspace, like the script.
        findings.append(
            _refusal("entrypoint.requirements", entry.requirements, root, "the requirements file")
        )
    return findings


def _data_dir_refusal(recipe_path: str, given: str) -> Finding:
    return Finding(
        code=CODE,
        severity="error",
        path=recipe_path,
        where="host",
        message=f"'{given[:300]}' lies in the Flightdeck service's data directory (its database and tokens)",
        fix="give the worker a workspace that does not hold the service's data directory, and name "
        "models and data from there",
    )


def confinement_findings(
    recipe: Recipe,
    workspace: str | Path,
    *,
    extra_roots: Iterable[str | Path] = (),
    run_dir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    scripts_dir: str | Path | None = None,
) -> list[Finding]:
    """S001 errors for every recipe path (and the run directory) that leads outside the allowed roots,
    into the service's data directory, or (a script job's program) where no program may come from."""
    roots = allowed_roots(workspace, extra_roots)
    stages = expand_stages(recipe)
    findings: list[Finding] = _entrypoint_findings(recipe, workspace, runs_dir, scripts_dir)
    for index, stage in enumerate(stages):
        prefix = f"stages[{index}]." if recipe.stages else ""
        for recipe_path, given, what in _stage_paths(stage):
            if recipe_path == "model.path" and is_hub_id(given, workspace):
                continue
            found = _check(prefix + recipe_path, given, workspace, roots, what)
            real = None if found else resolve_inside(given, workspace, roots)
            if real is not None and _service_data_dir(real) is not None:
                found = [_data_dir_refusal(prefix + recipe_path, given)]
            findings += found
    if run_dir is not None:
        # Its entries are checked too, so an `output` symlink leading out is caught with it.
        findings += _check("run_dir", str(run_dir), workspace, roots, "the run directory")
    return findings
