#!/usr/bin/env bash
# Sets everything up and runs the whole suite: lint, types, then pytest (end-to-end jobs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-browser.sh || echo "test: chromium could not be installed; browser tests will fail"
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check service worker tests bench migrations
ruff format --check service worker tests bench
mypy service
python -m pytest "$@"
