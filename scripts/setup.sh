#!/usr/bin/env bash
# Creates .venv and installs Flightdeck with every extra. CPU torch goes in first so pip never
# pulls the CUDA build; re-running is cheap (skipped when pyproject.toml has not changed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.flightdeck-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[service,worker,dev]"
    echo "$want" > "$stamp"
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
