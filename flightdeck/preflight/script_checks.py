"""The recipe rules and the memory estimate over what a script job's HF arguments say.

A script job that passes `--per_device_train_batch_size 16 --bf16 --model_name_or_path ...` is judged
by the same rules as a recipe with those values (flightdeck/recipe/script_args.py reads them). The
findings name the arguments, not recipe fields: a script's argv is never rewritten, so a rule that
would correct a recipe ('fix') is a warning that says what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flightdeck.preflight.rule_result import Correction, RuleResult
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe
from flightdeck.recipe.script_args import described_recipe, read_script_arguments

ARGS_PATH = "entrypoint.args"
_DESCRIBED_PARTS = ("model", "training", "data", "adapter")


def argument_findings(recipe: Recipe, rules: Iterable[Callable[[Recipe], list[RuleResult]]]) -> list[Finding]:
    """`rules` run on the job as its arguments describe it; each finding about a part the arguments
    gave, named by those arguments. Unreadable values of well-known arguments are warnings."""
    entry = recipe.entrypoint
    if entry is None:
        return []
    problems = [
        Finding(code=None, severity="warn", path=ARGS_PATH, message=f"{problem}; the checks skip it")
        for problem in read_script_arguments(entry.args).problems
    ]
    try:
        described = described_recipe(recipe)
    except ValueError as exc:
        message = f"{exc}: outside what the checks model, so the rules and the estimate skip the arguments"
        return [*problems, Finding(code=None, severity="warn", path=ARGS_PATH, message=message)]
    if described is None:
        return problems
    job, sources = described
    given = {part for part in _DESCRIBED_PARTS if getattr(recipe, part) is None}
    # Each rule sees the arguments as given: a correction would not reach the script, so none is applied.
    results = [result for rule in rules for result in rule(job)]
    findings = [r.finding if isinstance(r, Correction) else r for r in results]
    return problems + [_named(f, sources) for f in findings if f.path.split(".")[0] in given]


def _named(finding: Finding, sources: dict[str, str]) -> Finding:
    part = finding.path.split(".")[0]
    said = (
        sources.get(finding.path)
        or sources.get(part)
        or " ".join(text for path, text in sources.items() if path.startswith(part + ".") and text)
    )
    message = f"from the script's arguments ({said or 'the HF defaults'}): {finding.message}"
    if finding.severity == "fix":
        # A recipe would be corrected; a script's argv is not, so the user changes it.
        message += (
            f" (a recipe would be corrected to {finding.path} = {finding.value!r}; change the argument)"
        )
        return finding.model_copy(update={"severity": "warn", "path": ARGS_PATH, "message": message})
    return finding.model_copy(update={"path": ARGS_PATH, "message": message})


def estimated_recipe(recipe: Recipe) -> Recipe:
    """The recipe the memory estimate reads: a script job as its arguments describe it."""
    try:
        described = described_recipe(recipe) if recipe.entrypoint is not None else None
    except ValueError:
        return recipe  # argument_findings says which argument
    return described[0] if described is not None else recipe
