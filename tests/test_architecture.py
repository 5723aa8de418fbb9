"""The import rules of docs/architecture.md, enforced: read every module's imports (lazy ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "worker", "cli")
# The pure half of the service: the recipe, its checks, the plan and the wire contract. The worker and
# the CLI import these; they never touch a database or an HTTP server.
PURE = (
    "service.recipe",
    "service.preflight",
    "service.memory",
    "service.launch",
    "service.contracts",
    "service.inventory",
    "service.why_waiting",
    "service.statuses",
)
SERVER_LIBRARIES = (
    "fastapi",
    "starlette",
    "sqlmodel",
    "sqlalchemy",
    "alembic",
    "uvicorn",
    "prometheus_client",
)
TRAINING_LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "datasets")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute imports anywhere in the module, except under `if TYPE_CHECKING:` (never run)."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 0 and node.module:
                found.add(node.module)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


GRAPH = {_module(p): _imports(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(
    importers: tuple[str, ...], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()
) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in GRAPH.items()
        if _within(module, importers)
        for name in names
        if _within(name, forbidden) and not _within(name, allowed)
    )


def test_the_pure_half_of_the_service_never_imports_the_server_half_or_a_training_library() -> None:
    server_half = tuple(m for m in GRAPH if m.startswith("service.") and not _within(m, PURE))
    forbidden = (*server_half, "worker", "cli", *SERVER_LIBRARIES, *TRAINING_LIBRARIES)
    assert _violations(PURE, forbidden) == []


def test_the_worker_imports_only_the_pure_half_of_the_service() -> None:
    assert _violations(("worker",), ("service", "cli", *SERVER_LIBRARIES), allowed=PURE) == []


def test_the_service_never_imports_the_worker_or_the_cli() -> None:
    assert _violations(("service",), ("worker", "cli", *TRAINING_LIBRARIES)) == []


def test_the_trainer_side_never_imports_the_agent() -> None:
    # The trainer and a user's callback run inside torchrun's ranks: no agent code, no credentials.
    assert _violations(("worker.train", "worker.callback", "worker.instrument"), ("worker.agent",)) == []


def test_no_module_is_part_of_an_import_cycle() -> None:
    ours = {m: {n for n in names if n in GRAPH and n != m} for m, names in GRAPH.items()}

    def packages_of(name: str) -> set[str]:
        # `from worker.agent import rundir` imports the package too: an edge to it is no cycle.
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(ours[node] - packages_of(node)):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(ours):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize("document", ["docs/architecture.md"])
def test_the_architecture_document_names_every_top_level_module(document: str) -> None:
    text = (ROOT / document).read_text()
    top = sorted({".".join(m.split(".")[:2]) for m in GRAPH if m.count(".") >= 1})
    assert [m for m in top if f"`{m.replace('.', '/')}" not in text] == []
