"""A script job's program on this host: the file exists, is a file, and Python can compile it.

Runs after path confinement (flightdeck.worker.path_confinement), so the file is known to be in the workspace.
Compiling catches a syntax error before torchrun starts N ranks that would each die of it.
"""

from __future__ import annotations

from pathlib import Path

from flightdeck.preflight.rule_result import RuleResult, error
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.path_confinement import module_file


def entrypoint_findings(recipe: Recipe, workspace: Path) -> list[RuleResult]:
    entry = recipe.entrypoint
    if entry is None:
        return []
    if entry.script is not None:
        path, program = "entrypoint.script", workspace / entry.script
        what = f"the script '{entry.script}'"
    else:
        assert entry.module is not None
        path, program = "entrypoint.module", module_file(entry.module, workspace)
        what = f"the module '{entry.module}' ({program.relative_to(workspace)})"
    if not program.is_file():
        near = sorted(p.name for p in program.parent.glob("*.py"))[:10] if program.parent.is_dir() else []
        listed = f"; {program.parent.relative_to(workspace)}/ holds: {', '.join(near)}" if near else ""
        return [
            error(
                None,
                path,
                f"{what} is not a file in the worker's workspace ({workspace}){listed}",
                "host",
                f"name the file relative to the workspace in {path}, or put the script there",
            )
        ]
    try:
        compile(program.read_bytes(), str(program), "exec")
    except (SyntaxError, ValueError) as exc:
        where = f" at line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        return [
            error(
                None, path, f"{what} does not compile: {exc}", "host", f"fix the script{where}, then resubmit"
            )
        ]
    return []
