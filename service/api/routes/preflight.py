"""POST /preflight: the dry run of a recipe (findings, effective recipe, memory, launch-plan preview)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from service.api.deps import JsonBody, UserState, json_object_schema
from service.api.routes.jobs import REFUSED, refused
from service.inventory import WorkerInventory, notional_inventory
from service.jobs import scheduling_findings
from service.launch.plan import PlanError, build_launch_plan
from service.preflight import preflight_for_host
from service.recipe import Finding, RecipeInvalid, parse_recipe
from service.recipe.validate import findings_from_validation

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
def preflight(_: UserState, payload: JsonBody) -> Any:
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
    resources = dry.effective.resources
    # Without a described worker the plan is previewed on one that fits exactly: the argv (a script
    # job's program included) and every variable's reason, less what only a real host decides.
    target = host or notional_inventory(
        resources.gpus_per_node, resources.accelerator, resources.gpu_memory_gb
    )
    answer["plan_on"] = (
        "the described worker"
        if host is not None
        else (
            "a notional worker with exactly the devices the recipe asks for; pass a host inventory for a real one"
        )
    )
    devices = list(range(min(target.device_count, resources.gpus_per_node)))
    try:
        plan = build_launch_plan(dry.effective, target, job_id=0, attempt_number=1, devices=devices)
        answer["plan"] = plan.model_dump(mode="json")
    except PlanError as exc:
        answer["ok"] = False
        answer["plan_error"] = str(exc)
    return JSONResponse(answer)
