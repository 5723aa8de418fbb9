"""Liveness and the published recipe schema (no token needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import text

from flightdeck.recipe import recipe_json_schema
from flightdeck.service.api.deps import StateDep

router = APIRouter(tags=["meta"])
_SCHEMA = recipe_json_schema()


@router.get("/healthz")
def healthz(state: StateDep) -> dict[str, str]:
    with state.db.read() as session:
        session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/recipes/schema")
def schema() -> dict[str, Any]:
    return _SCHEMA
