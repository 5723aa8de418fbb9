"""POST /preflight: the dry run of a recipe (findings, effective recipe, memory, launch-plan preview)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from flightdeck.inventory import WorkerInventory
from flightdeck.preflight import preflight_for_host
from flightdeck.recipe import Finding, RecipeInvalid, parse_recipe
from flightdeck.recipe.validate import findings_from_validation
from flightdeck.service.api.deps import RecipeBody, UserState, json_object_schema
from flightdeck.service.api.routes.jobs import REFUSED, refused
from flightdeck.service.jobs import scheduling_findings

router = APIRouter(tags=["preflight"])

_WRAPPER_KEYS = {"recipe", "host", "model_config"}


@router.post(
    "/preflight",
    responses=REFUSED,
    openapi_extra=json_object_schema(
        "A recipe, or {'recipe': ..., 'host': WorkerInventory, 'model_config': config.json} "
        "to add the host rules, the launch plan on that host and the memory estimate."
    ),
)
def preflight(_: UserState, payload: RecipeBody) -> Any:
    wrapped = isinstance(payload, dict) and "recipe" in payload and set(payload) <= _WRAPPER_KEYS
    body = payload if wrapped else {"recipe": payload}
    try:
        recipe = parse_recipe(body["recipe"])
        host = WorkerInventory.model_validate(body["host"]) if body.get("host") is not None else None
    except RecipeInvalid as exc:
        return refused(exc.findings)
    except ValidationError as exc:
        return refused(findings_from_validation(exc, ("host",)))
    model_config = body.get("model_config")
    if model_config is not None and not isinstance(model_config, dict):
        return refused([Finding(path="model_config", message="must be the model's config.json object")])
    dry = preflight_for_host(recipe, host, model_config)
    findings = dry.findings + scheduling_findings(recipe)
    answer: dict[str, Any] = {
        "ok": not any(f.severity == "error" for f in findings),
        "findings": [f.model_dump(mode="json") for f in findings],
        "effective_recipe": dry.effective.model_dump(mode="json"),
        "memory": dry.memory,
        "plan": None,
    }
    answer["plan"] = dry.plan.model_dump(mode="json") if dry.plan is not None else None
    answer["plan_on"] = dry.plan_on
    if dry.plan_error is not None:
        answer["ok"] = False
        answer["plan_error"] = dry.plan_error
    return JSONResponse(answer)
