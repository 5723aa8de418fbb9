"""Loaded by Python at start-up because the launch plan put this directory on PYTHONPATH.

Installs Flightdeck's post-import hooks in the ranks of an instrumented script job (torchrun sets
LOCAL_RANK for them, not for itself). Never raises: a script must run as it would without Flightdeck.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows (a distribution's or a virtualenv's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    # flightdeck.run_variables.INSTRUMENT_VARIABLE, spelled out: this runs in every process of the job
    # (torchrun too) before anything is imported.
    if os.environ.get("FLIGHTDECK_INSTRUMENT") == "1" and "LOCAL_RANK" in os.environ:
        from flightdeck.worker.instrument.hooks import install

        install()
except Exception as exc:
    print(f"[flightdeck] instrumentation not installed: {exc!r}", file=sys.stderr, flush=True)

try:
    _chain_next_sitecustomize()
except Exception as exc:
    print(f"[flightdeck] the environment's own sitecustomize failed: {exc!r}", file=sys.stderr, flush=True)
