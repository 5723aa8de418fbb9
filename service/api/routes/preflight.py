"""POST /preflight: the dry run of a recipe (findings, effective recipe, launch-plan preview)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from service.api.deps import JsonBody, StateDep, UserDep, json_object_schema
from service.api.routes.jobs import refused
from service.inventory import WorkerInventory
from service.jobs import validate_submission
from service.launch.plan import build_launch_plan
from service.recipe import Finding, RecipeInvalid
from service.recipe.validate import findings_from_validation

router = APIRouter(tags=["preflight"])


@router.post(
    "/preflight",
    openapi_extra=json_object_schema(
        'Either a recipe, or {"recipe": ..., "host": WorkerInventory} to preview the launch on a described host.'
    ),
)
def preflight(state: StateDep, _user: UserDep, payload: JsonBody) -> Any:
    wrapped = isinstance(payload, dict) and "recipe" in payload and "name" not in payload
    recipe_payload = payload["recipe"] if wrapped else payload
    try:
        _, effective, findings = validate_submission(recipe_payload)
    except RecipeInvalid as exc:
        return refused(exc.findings)
    answer: dict[str, Any] = {
        "ok": True,
        "findings": [f.model_dump(mode="json") for f in findings],
        "effective_recipe": effective.model_dump(mode="json"),
        "plan": None,
    }
    if wrapped and payload.get("host") is not None:
        try:
            host = WorkerInventory.model_validate(payload["host"])
        except ValidationError as exc:
            return refused(findings_from_validation(exc, ("host",)))
        devices = list(range(min(host.device_count, effective.resources.gpus_per_node)))
        if host.device_count < effective.resources.gpus_per_node:
            answer["findings"].append(
                Finding(
                    code="P004",
                    path="resources.gpus_per_node",
                    where="host",
                    message=f"the host has {host.device_count} device(s); ask for at most that many",
                ).model_dump(mode="json")
            )
            answer["ok"] = False
        answer["plan"] = build_launch_plan(
            effective, host, job_id=0, attempt_number=1, devices=devices
        ).model_dump(mode="json")
    return JSONResponse(answer)
