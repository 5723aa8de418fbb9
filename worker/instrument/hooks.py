"""Post-import hooks: run an action on a module right after it is first imported, whoever imports it.

A `sys.meta_path` finder asks the other finders for the module's spec and wraps its loader so that
the action runs once the module's code has run. Nothing is imported ahead of the script: a script
that never imports transformers never loads it because of Flightdeck.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Action = Callable[[ModuleType], None]


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs `actions[name](module)` once, after module `name` is executed."""

    def __init__(self, actions: dict[str, Action]):
        self.actions = dict(actions)

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        action = self.actions.get(name)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            del self.actions[name]
            spec.loader = _RunAfter(spec.loader, action)
        return spec


class _RunAfter(importlib.abc.Loader):
    """The module's own loader, then the action; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, action: Action):
        self.loader = loader
        self.action = action

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        run_safely(self.action, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # get_source, is_package, ... as the real loader answers


def run_safely(action: Action, module: ModuleType) -> None:
    """An action that fails is reported once and forgotten: the script runs on unwatched."""
    try:
        action(module)
    except Exception as exc:
        print(
            f"[flightdeck] instrumentation of {module.__name__} skipped: {exc!r}", file=sys.stderr, flush=True
        )


def after_import(actions: dict[str, Action]) -> AfterImport:
    """Install `actions`; a module already imported gets its action now."""
    pending = {}
    for name, action in actions.items():
        if name in sys.modules:
            run_safely(action, sys.modules[name])
        else:
            pending[name] = action
    finder = AfterImport(pending)
    sys.meta_path.insert(0, finder)
    return finder


def install() -> None:
    """What an instrumented rank gets: the Trainer's callback, the loop watch and the end markers."""
    import faulthandler
    import signal

    from flightdeck.worker.instrument import script_end

    # The agent asks a rank that outlives its script for its stacks (H008: where it waits).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    script_end.install()
    after_import(
        {
            "transformers.trainer": _patch_trainer,
            "torch": _watch_loop,
            "torch.distributed": script_end.watch_leaving,
        }
    )


# Imported when their module is: a script that never imports torch never loads it because of Flightdeck.
def _patch_trainer(module: ModuleType) -> None:
    from flightdeck.worker.instrument import trainer_patch

    trainer_patch.patch(module)


def _watch_loop(module: ModuleType) -> None:
    from flightdeck.worker.instrument import loop_watch

    loop_watch.install(module)
