"""Fixtures for end-to-end tests: a tiny model and data once per session, and a process factory."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .failure_state import describe
from .processes import Agent, Managed, Service, free_tcp_port, kill_strays

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with every tiny model and the demo datasets, built once per session."""
    from flightdeck.worker.tiny import make_demo_workspace

    # Every tiny model: the examples (R1 and R2 are vision-language) run end to end from here.
    workspace = make_demo_workspace(tmp_path_factory.mktemp("workspace"), text_lines=100)
    # Script jobs run files of the workspace: the own-script examples, at the paths their jobs name.
    shutil.copytree(EXAMPLES / "own-script", workspace / "examples" / "own-script")
    return workspace


# The processes a test's `cluster` started, for its failure report.
_STARTED = pytest.StashKey[list[Managed]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the jobs, logs and stacks of its processes, taken while they live."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and report.failed and _STARTED in item.stash:
        report.sections.append(("flightdeck state at the failure", describe(item.stash[_STARTED])))


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, tiny_workspace: Path
) -> Iterator[Callable[..., Any]]:
    """Factory: `cluster("service", lease="4")` -> Service (`data=` names its data directory, so its
    database; by default one for the test); `cluster("agent", service, name)` -> Agent (`runs=` names its
    runs directory; by default its own)."""
    started: list[Managed] = []
    request.node.stash[_STARTED] = started

    def make(kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "service":
            data_dir = tmp_path / kwargs.pop("data", "data")
            settings = {f"FLIGHTDECK_{k.upper()}": str(v) for k, v in kwargs.items()}
            managed: Managed = Service(data_dir, free_tcp_port(), **settings)
        else:
            service, name = args
            # runs="shared": agents of one host sharing a runs directory (a retry finds the checkpoints).
            runs = kwargs.pop("runs", name)
            managed = Agent(service, tiny_workspace, tmp_path / f"runs-{runs}", name, **kwargs)
        started.append(managed)
        managed.start()
        return managed

    yield make
    for managed in reversed(started):
        managed.stop(timeout=20)
    kill_strays(str(tmp_path))
