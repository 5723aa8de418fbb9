#!/usr/bin/env bash
# Sets everything up and runs lint, types and the default test run (every kind of test, one real
# end-to-end torchrun job among them; a few minutes). Arguments go to pytest and replace the default
# selection: `scripts/test.sh -m slow` runs the long end-to-end runs, `scripts/test.sh tests/service` one
# folder. CI (.ci/run) runs the default and then `-m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-browser.sh || echo "test: chromium could not be installed; browser tests will fail"
bash scripts/install-postgres.sh || echo "test: PostgreSQL could not be installed; its test variants will skip"
bash scripts/install-slurm.sh || echo "test: Slurm could not be installed; the Slurm tests (slow) will skip"
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "${FLIGHTDECK_SKIP_LINT:-0}" != 1 ]; then
    ruff check flightdeck setup.py service worker cli tests bench migrations scripts examples
    ruff format --check flightdeck setup.py service worker cli tests bench scripts examples
    # The type check runs beside the tests, its output printed after them: mypy takes about a minute of
    # one core from a cold cache, which the test workers, waiting on processes, mostly leave idle.
    types_log=$(mktemp)
    bash scripts/typecheck.sh >"$types_log" 2>&1 &
    types_pid=$!
    trap 'kill "$types_pid" 2>/dev/null || true; rm -f "$types_log"' EXIT
fi
if [ $# -eq 0 ]; then
    set -- -m "not slow and not docker"
fi
# Two pytest-xdist workers: most tests wait on a served process, torchrun or Slurm rather than
# compute, so two at a time keep a 2-core machine busy (the default run there: 7:56 in one process,
# 4:17 in two; three made the slow run slower, 36:08 against 31:59). FLIGHTDECK_TEST_WORKERS=0 runs everything in this one process; the docker tests
# need that (one private engine and its images for the session).
workers=${FLIGHTDECK_TEST_WORKERS:-2}
# The slowest tests are printed so CI's time can be kept in check from its own output.
status=0
python -m pytest -n "$workers" --dist worksteal --durations=25 "$@" || status=$?
if [ -n "${types_pid:-}" ]; then
    if wait "$types_pid"; then
        cat "$types_log"
    else
        echo "test: the type check (scripts/typecheck.sh) failed:"
        cat "$types_log"
        status=1
    fi
fi
exit "$status"
