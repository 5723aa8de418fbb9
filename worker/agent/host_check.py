"""Calls the host preflight (worker.host_preflight) before launch and shapes its findings for reports."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any

from service.inventory import WorkerInventory
from service.recipe.schema import Recipe

log = logging.getLogger("flightdeck.agent")

_EVENT_SEVERITY = {"error": "error", "warn": "warn", "fix": "info"}


@dataclass
class HostCheck:
    """Host findings as JSON objects, and the recipe with host fixes applied when there are any."""

    findings: list[dict[str, Any]] = field(default_factory=list)
    effective: dict[str, Any] | None = None

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f.get("severity") == "error"]

    def events(self) -> list[dict[str, Any]]:
        return [
            {
                "key": f"preflight:{i}",
                "kind": "preflight",
                "code": f.get("code"),
                "severity": _EVENT_SEVERITY.get(str(f.get("severity")), "warn"),
                "message": f"{f.get('path') or 'host'}: {f.get('message')}",
                "fix": f.get("fix"),
                "step": None,
                "data": {"path": f.get("path"), "where": f.get("where", "host")},
            }
            for i, f in enumerate(self.findings)
        ]


def run_host_check(recipe: dict[str, Any], inventory: WorkerInventory, devices: list[int]) -> HostCheck:
    """Host rules against the real GPUs, files and ports; no check at all when the module is absent."""
    # find_spec, not ImportError: a host_preflight that fails to import must fail loudly.
    run_host_preflight = None
    if importlib.util.find_spec("worker.host_preflight") is not None:
        run_host_preflight = getattr(
            importlib.import_module("worker.host_preflight"), "run_host_preflight", None
        )
    if run_host_preflight is None:
        log.warning("worker.host_preflight.run_host_preflight is missing; launching without host preflight")
        return HostCheck()
    result = run_host_preflight(Recipe.model_validate(recipe), inventory, inventory.workspace, devices)
    raw = result if isinstance(result, list) else getattr(result, "findings", [])
    findings = [f.model_dump(mode="json") if hasattr(f, "model_dump") else dict(f) for f in raw]
    effective = getattr(result, "effective", None)
    if effective is not None and hasattr(effective, "model_dump"):
        effective = effective.model_dump(mode="json")
    return HostCheck(findings=findings, effective=effective)
