"""A script job's args: a brace word that is not one of the placeholders but reads like one.

`{outdir}` for `{output_dir}` reaches the script as the literal text (any other brace is the script's
own: a prompt template's `{instruction}` is meant literally), and the run writes to a directory named
`{outdir}`. Only a near miss of a placeholder's name is reported, as a warning.
"""

from __future__ import annotations

import difflib
import re

from flightdeck.contracts import RESUME_PLACE
from flightdeck.launch.plan import RUN_PLACES
from flightdeck.memory.architecture import ModelShape
from flightdeck.preflight.rule_result import RuleResult
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe

PLACES = (*RUN_PLACES, RESUME_PLACE)
_NAMES = [place.strip("{}") for place in PLACES]
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def misspelt_placeholders(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    entry = recipe.entrypoint
    if entry is None:
        return []
    found: list[RuleResult] = []
    for index, arg in enumerate(entry.args):
        for name in _BRACED.findall(arg):
            near = difflib.get_close_matches(name, [n for n in _NAMES if n != name], n=1, cutoff=0.6)
            if name in _NAMES or not near:
                continue
            found.append(
                Finding(
                    severity="warn",
                    path=f"entrypoint.args[{index}]",
                    message=f"'{{{name}}}' is not a placeholder: the script gets it as it is. Did you mean "
                    f"'{{{near[0]}}}'? The placeholders are {', '.join(PLACES)}.",
                    where="static",
                    fix=f"write '{{{near[0]}}}', or leave it if the script means the text '{{{name}}}'",
                )
            )
    return found


SCRIPT_ARG_RULES = (misspelt_placeholders,)
