#!/usr/bin/env bash
# Creates .venv and installs Flightdeck with every extra. CPU torch goes in first so pip never
# pulls the CUDA build; re-running is cheap (skipped when pyproject.toml and setup.py have not changed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=torch==2.13.0
# PyTorch's own CPU-only index; on a stock PyPI index a plain `pip install torch` on Linux is the
# multi-GB CUDA build. Where it cannot be reached (a mirror-only network) the default index is used.
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.flightdeck-installed
want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)  # setup.py lists the packages
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    if .venv/bin/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" \
        "$TORCH_CPU_INDEX" 2>/dev/null \
        && .venv/bin/python -m pip install --quiet --index-url "$TORCH_CPU_INDEX" "$TORCH"; then
        echo "setup: $TORCH from PyTorch's CPU index ($TORCH_CPU_INDEX)"
    else
        .venv/bin/python -m pip install --quiet "$TORCH"
        echo "setup: $TORCH from the default index (PyTorch's CPU index is not reachable from here)"
    fi
    .venv/bin/python -m pip install --quiet -e ".[service,worker,dev]"
    echo "$want" > "$stamp"
fi
.venv/bin/python -c 'import torch; torch.version.cuda and print("setup: warning: torch is a CUDA build (%s); the CPU wheel is smaller" % torch.version.cuda)'
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
