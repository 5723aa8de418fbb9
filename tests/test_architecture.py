"""The import rules of docs/architecture.md, enforced: read every module's imports (lazy ones too)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flightdeck", "service", "worker", "cli")
# The pure half: the recipe, its checks, the plan and the wire contract, in flightdeck/ beside the user's
# flightdeck.callback (which is not pure: it imports the trainer side), and the service's one pure helper.
# The worker and the CLI import these; they never touch a database or an HTTP server.
PURE = (
    "flightdeck.recipe",
    "flightdeck.preflight",
    "flightdeck.memory",
    "flightdeck.launch",
    "flightdeck.contracts",
    "flightdeck.inventory",
    "flightdeck.service.why_waiting",
    "flightdeck.statuses",
    "flightdeck.run_variables",
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
    """The import name of a file: service/, worker/ and cli/ are installed under flightdeck."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "flightdeck":
        parts.insert(0, "flightdeck")
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
    server_half = tuple(m for m in GRAPH if m.startswith("flightdeck.service.") and not _within(m, PURE))
    forbidden = (
        *server_half,
        "flightdeck.worker",
        "flightdeck.cli",
        "flightdeck.callback",
        *SERVER_LIBRARIES,
        *TRAINING_LIBRARIES,
    )
    assert _violations(PURE, forbidden) == []


def test_the_worker_imports_only_the_pure_half_of_the_service() -> None:
    assert (
        _violations(
            ("flightdeck.worker",), ("flightdeck.service", "flightdeck.cli", *SERVER_LIBRARIES), allowed=PURE
        )
        == []
    )


def test_the_service_never_imports_the_worker_or_the_cli() -> None:
    assert (
        _violations(("flightdeck.service",), ("flightdeck.worker", "flightdeck.cli", *TRAINING_LIBRARIES))
        == []
    )


def test_the_trainer_side_never_imports_the_agent() -> None:
    # The trainer and a user's callback run inside torchrun's ranks: no agent code, no credentials.
    assert (
        _violations(
            (
                "flightdeck.worker.train",
                "flightdeck.worker.callback",
                "flightdeck.worker.loop_monitor",
                "flightdeck.worker.script_run",
                "flightdeck.worker.instrument",
                "flightdeck.callback",
            ),
            ("flightdeck.worker.agent",),
        )
        == []
    )


def test_no_module_is_part_of_an_import_cycle() -> None:
    ours = {m: {n for n in names if n in GRAPH and n != m} for m, names in GRAPH.items()}

    def packages_of(name: str) -> set[str]:
        # `from flightdeck.worker.agent import rundir` imports the package too: an edge to it is no cycle.
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


def test_each_run_variable_is_spelled_only_where_it_is_defined() -> None:
    """The plan sets them and the ranks read them by flightdeck/run_variables.py's names; a second spelling
    is how the two sides drift. The one exception is the autoload sitecustomize, which runs in every
    process of a job before anything is imported (its comment says so)."""
    from flightdeck import run_variables

    names = {value for key, value in vars(run_variables).items() if key.endswith("_VARIABLE")}
    allowed = {ROOT / "flightdeck/run_variables.py", ROOT / "worker/instrument/autoload/sitecustomize.py"}
    spelled = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in names:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert len(names) == 4 and spelled == []


@pytest.mark.parametrize("document", ["docs/architecture.md"])
def test_the_architecture_document_names_every_top_level_module(document: str) -> None:
    text = (ROOT / document).read_text()

    def place(module: str) -> str | None:
        # service/jobs, worker/agent, cli/main; a package or module of flightdeck/ itself by its own name.
        parts = module.split(".")
        if len(parts) < 2:
            return None
        if parts[1] in ("service", "worker", "cli"):
            return "/".join(parts[1:3]) if len(parts) >= 3 else None
        return "flightdeck/" + parts[1]

    top = sorted({p for p in map(place, GRAPH) if p is not None})
    assert [m for m in top if f"`{m}" not in text] == []


# --- the installed layout: one import name ----------------------------------------------------------


def _outside_the_repository(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """This venv's interpreter started as the agent starts ranks: cwd elsewhere, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_only_flightdeck_is_importable_outside_the_repository(tmp_path: Path) -> None:
    probe = (
        "import importlib.util, json; names = sys_names = "
        "['flightdeck', 'flightdeck.callback', 'flightdeck.service.api', 'flightdeck.worker.train', "
        "'flightdeck.worker.agent.run_attempt', 'flightdeck.cli.main', 'service', 'worker', 'cli']; "
        "print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))"
    )
    result = _outside_the_repository(tmp_path, probe)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert [name for name, there in found.items() if there != name.startswith("flightdeck")] == [], found
    # A rank imports the trainer by module name with its cwd in the run directory.
    result = _outside_the_repository(
        tmp_path, "import flightdeck.worker.instrument as i; print(i.AUTOLOAD_DIR)"
    )
    assert result.returncode == 0 and (Path(result.stdout.strip()) / "sitecustomize.py").is_file(), result


def test_the_rules_see_every_first_party_import_by_the_name_it_is_imported_by() -> None:
    """A rule over names no import uses passes vacuously: every import of ours must name a module of GRAPH."""
    ours = {n for names in GRAPH.values() for n in names if n.split(".")[0] in PACKAGES}
    assert [n for n in sorted(ours) if n not in GRAPH and n.rpartition(".")[0] not in GRAPH] == []


def test_the_users_callback_path_forwards_every_public_name_of_the_callbacks_home() -> None:
    """flightdeck.callback re-exports flightdeck.worker.callback's __all__ (read, not imported: no torch),
    each name from its home module (FlightdeckCallback when first asked for, inside a function)."""

    def public(path: Path) -> set[str]:
        [names] = [
            ast.literal_eval(node.value)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
        ]
        return set(names)

    forwarded = {
        alias.name
        for node in ast.walk(ast.parse((ROOT / "flightdeck" / "callback.py").read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flightdeck.worker.")
        for alias in node.names
    }
    assert forwarded == public(ROOT / "worker" / "callback.py") == public(ROOT / "flightdeck" / "callback.py")


@pytest.mark.slow
def test_the_wheel_holds_only_flightdeck(tmp_path: Path) -> None:
    """`pip wheel` of a copy of the sources (the build writes build/ and egg-info next to them)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("flightdeck", *PACKAGES[1:]):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("flightdeck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"flightdeck", wheel.name.split("-py")[0] + ".dist-info"}
    for expected in (
        "flightdeck/callback.py",
        "flightdeck/recipe/schema.py",
        "flightdeck/contracts.py",
        "flightdeck/py.typed",
        "flightdeck/service/py.typed",
        "flightdeck/service/dashboard/static/index.html",
        "flightdeck/worker/instrument/autoload/sitecustomize.py",
        "flightdeck/cli/main.py",
    ):
        assert expected in names, expected
    entry_points = (
        zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py')[0]}.dist-info/entry_points.txt").decode()
    )
    assert "flightdeck = flightdeck.cli.main:main" in entry_points
