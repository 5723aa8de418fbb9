"""One launch variable with its reason, and the names the plan leaves for the host to fill."""

from __future__ import annotations

from pydantic import BaseModel, Field

# Port variables whose null value the runner fills with the one port resolved for the attempt (E002).
PORT_VARIABLES = ("MASTER_PORT", "PET_MASTER_PORT")
# A null PYTHONPATH in a script job's plan: the agent puts its instrumentation directory (when the
# plan sets FLIGHTDECK_INSTRUMENT) and the workspace there, both host facts.
PATH_VARIABLE = "PYTHONPATH"


class EnvVar(BaseModel):
    """One environment variable of the launch; `value` None means the agent resolves it on the host."""

    name: str
    value: str | None
    reason: str
    code: str | None = Field(
        None, description="The catalog code of a decision that corrects the recipe (E003, E005)."
    )
