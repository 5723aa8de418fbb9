"""A script job's requirements file on this host: it exists, and it does not ask for another torch (E009).

The job's environment is layered over the worker's and keeps the worker's torch, the build that
matches this host's CUDA driver (worker/agent/job_environment.py). A line that pins torch to a
version the worker's does not satisfy, or names a torch wheel or URL, would replace it: refused
here, before anything is built, naming the line. `torch` alone, or a range the worker's version
satisfies, is left as it is (pip finds it installed). Nested `-r` files are read too; a torch that
only a dependency asks for is the build's constraint's business (E008 naming torch).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from flightdeck.preflight.rule_result import RuleResult, error
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.schema import Recipe

CODE = "E009"
PATH = "entrypoint.requirements"
_NESTED = re.compile(r"^(?:-r|--requirement)(?:\s+|=)(\S+)")
_MAX_NESTING = 5


def requirements_findings(recipe: Recipe, workspace: Path) -> list[RuleResult]:
    entry = recipe.entrypoint
    if entry is None or entry.requirements is None:
        return []
    file = workspace / entry.requirements
    if not file.is_file():
        near = sorted(p.name for p in file.parent.glob("*.txt"))[:10] if file.parent.is_dir() else []
        listed = f"; {file.parent.relative_to(workspace)}/ holds: {', '.join(near)}" if near else ""
        return [
            error(
                None,
                PATH,
                f"the requirements file '{entry.requirements}' is not a file in the worker's workspace "
                f"({workspace}){listed}",
                "host",
            )
        ]
    torch = _installed_torch()
    if torch is None:
        return []  # nothing to keep: pip decides
    return [_replaces_torch(where, line, torch) for where, line in _torch_lines(file, workspace)]


def _installed_torch() -> Version | None:
    try:
        return Version(metadata.version("torch"))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def _torch_lines(file: Path, workspace: Path, depth: int = 0) -> list[tuple[str, str]]:
    """(`file:line`, the line) for each torch requirement the worker's torch would not satisfy."""
    found: list[tuple[str, str]] = []
    torch = _installed_torch()
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for number, raw in enumerate(text.replace("\\\n", "").splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        nested = _NESTED.match(line)
        if nested and depth < _MAX_NESTING:
            inner = (file.parent / nested.group(1)).resolve()
            if inner.is_file() and inner.is_relative_to(workspace.resolve()):
                found += _torch_lines(inner, workspace, depth + 1)
            continue
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            if re.search(r"(^|/)torch-\d[^/]*\.whl$", line):
                found.append((f"{file.name}:{number}", line))  # a wheel file of torch
            continue  # pip reports what it cannot parse (E008)
        if canonicalize_name(req.name) != "torch":
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        if req.url or (torch is not None and not req.specifier.contains(torch, prereleases=True)):
            found.append((f"{file.name}:{number}", line))
    return found


def _replaces_torch(where: str, line: str, torch: Version) -> Finding:
    return Finding(
        code=CODE,
        severity="error",
        path=PATH,
        where="host",
        message=f"{where} asks for '{line[:200]}', which would replace the worker's torch {torch} (the build "
        "that matches this host's CUDA driver); a job's environment keeps the worker's torch",
        fix=f"remove the torch line (or allow torch {torch.base_version}), or run the job on a worker whose "
        "torch is the version the script needs",
    )
