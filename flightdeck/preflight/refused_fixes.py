"""When the preflight's own fix makes a recipe the trainer would refuse: findings that name the fix."""

from __future__ import annotations

from flightdeck.recipe.findings import Finding


def _field(path: str) -> str:
    """'stages[1].model.device_map' -> 'model.device_map.' (a stage's path read as the base's)."""
    return path.split("].", 1)[1] + "." if path.startswith("stages[") else path + "."


def fixes_the_trainer_refuses(refusals: list[Finding], fixes: list[Finding]) -> list[Finding]:
    """One finding per refusal of the fixed recipe, naming the fixes that wrote that field (or a part
    of it), else every fix that was applied: a Flightdeck bug, said as one, so the job is not queued."""
    problems = []
    for problem in refusals:
        culprits = [
            f
            for f in fixes
            if f.path
            and (
                _field(problem.path).startswith(_field(f.path))
                or _field(f.path).startswith(_field(problem.path))
            )
        ] or fixes
        names = ", ".join(dict.fromkeys(f"{f.code} ({f.path}: {f.fix})" for f in culprits)) or "none"
        problems.append(
            Finding(
                code=culprits[0].code if culprits else problem.code,
                path=problem.path,
                message=f"Flightdeck's own preflight fix {names} produced a recipe the trainer would refuse "
                f"({problem.path}: {problem.message}); this is a Flightdeck bug, not your recipe's, so the job "
                "was not queued (it could only fail). Apply the fix in the recipe yourself and resubmit, "
                "and report the bug.",
            )
        )
    return problems
