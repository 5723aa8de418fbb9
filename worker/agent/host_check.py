"""Calls the host preflight (flightdeck.worker.host_preflight) before launch and shapes its findings for reports."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightdeck.contracts import attempt_event
from flightdeck.inventory import WorkerInventory
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe
from flightdeck.worker.host_preflight import run_host_preflight
from flightdeck.worker.path_confinement import confinement_findings

# Two attempts starting at once must not run host preflight side by side: transformers' lazy
# module loading is not thread-safe ("cannot import name 'AutoConfig'" from a half-built module).
_HOST_PREFLIGHT_LOCK = threading.Lock()

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
        """One preflight event per finding. A host fix carries the value it wrote (`data.value`): the job's
        effective recipe was made before any host saw the model, so this is where the user reads what the
        host resolved, e.g. model.freeze's part names as this architecture's module prefixes."""
        return [
            attempt_event(
                f"preflight:{i}",
                "preflight",
                f"{f.get('path') or 'host'}: {f.get('message')}",
                code=f.get("code"),
                severity=_EVENT_SEVERITY.get(str(f.get("severity")), "warn"),
                fix=f.get("fix"),
                data={"path": f.get("path"), "where": f.get("where", "host")}
                | ({"value": f["value"]} if f.get("value") is not None else {}),
            )
            for i, f in enumerate(self.findings)
        ]


def run_host_check(
    recipe: dict[str, Any],
    inventory: WorkerInventory,
    devices: list[int],
    *,
    extra_roots: Sequence[str | Path] = (),
    run_dir: str | Path | None = None,
    scripts_dir: str | Path | None = None,
) -> HostCheck:
    """The recipe's paths against the allowed roots, then host rules against the real GPUs, files and ports.

    Confinement comes first: a path outside the roots is never opened, so no file's field names
    or sample text reach the events (S001).
    """
    parsed = Recipe.model_validate(recipe)
    if parsed.is_script and not inventory.runs_scripts:
        # The claim never offers a script job to such a worker; this holds if the service is older.
        refusal = Finding(
            path="entrypoint",
            where="host",
            message="this worker runs no script jobs (started with --no-scripts); submit it where "
            "`flightdeck workers` shows scripts allowed",
        )
        return HostCheck(findings=[refusal.model_dump(mode="json")])
    roots = [inventory.runs_dir, *extra_roots] if inventory.runs_dir else list(extra_roots)
    confined = confinement_findings(
        parsed,
        inventory.workspace,
        extra_roots=roots,
        run_dir=run_dir,
        runs_dir=inventory.runs_dir,
        scripts_dir=scripts_dir,
    )
    if any(f.severity == "error" for f in confined):
        return HostCheck(findings=[f.model_dump(mode="json") for f in confined])
    with _HOST_PREFLIGHT_LOCK:
        result = run_host_preflight(parsed, inventory, Path(inventory.workspace), devices)
    findings = [f.model_dump(mode="json") for f in [*result.findings, *confined]]
    return HostCheck(findings=findings, effective=result.effective.model_dump(mode="json"))
