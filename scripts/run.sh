#!/usr/bin/env bash
# Sets everything up, builds the tiny demo model and data once, then runs the service on
# http://127.0.0.1:8000 (SQLite under ./flightdeck-data) with one local CPU worker. Ctrl-C stops both.
# The worker's workspace is ./workspace: models, data, runs and the example scripts, nothing else. A
# script job runs code from there, so the virtualenv, the service's data (database, tokens) and the
# source tree stay outside it (docs/own-script.md, "Where scripts may live").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export FLIGHTDECK_DATA_DIR=${FLIGHTDECK_DATA_DIR:-$PWD/flightdeck-data}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export FLIGHTDECK_WORKSPACE=${FLIGHTDECK_WORKSPACE:-$PWD/workspace}
PORT=${FLIGHTDECK_PORT:-8000}
# The tiny models and demo data the examples read (~5 s the first time, kept after), and the example
# scripts the own-script jobs name (copied afresh: the workspace holds copies, never the source tree).
flightdeck make-demo-workspace "$FLIGHTDECK_WORKSPACE"
rm -rf "$FLIGHTDECK_WORKSPACE/examples/own-script"
mkdir -p "$FLIGHTDECK_WORKSPACE/examples"
cp -r examples/own-script "$FLIGHTDECK_WORKSPACE/examples/own-script"

flightdeck serve --host 127.0.0.1 --port "$PORT" --data-dir "$FLIGHTDECK_DATA_DIR" &
service_pid=$!
worker_pid=
trap 'kill $worker_pid $service_pid 2>/dev/null; wait' EXIT INT TERM
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
    kill -0 $service_pid 2>/dev/null || { echo "run: the service did not start"; exit 1; }
    sleep 0.2
done
# The service wrote a generated token pair here on first start unless tokens came from the environment.
if [ -f "$FLIGHTDECK_DATA_DIR/tokens.env" ]; then
    set -a; . "$FLIGHTDECK_DATA_DIR/tokens.env"; set +a
fi
# Through the environment, not argv: a token on the command line shows in every `ps`.
export FLIGHTDECK_WORKER_TOKEN=${FLIGHTDECK_WORKER_TOKEN:-${FLIGHTDECK_WORKER_TOKENS%%,*}}
flightdeck worker --service "http://127.0.0.1:$PORT" --workspace "$FLIGHTDECK_WORKSPACE" --cpu-slots 2 --name local-cpu &
worker_pid=$!
cat <<MSG

Flightdeck is running on http://127.0.0.1:$PORT with a local CPU worker (2 slots).
Tokens: $FLIGHTDECK_DATA_DIR/tokens.env
Worker workspace (models, data, runs, scripts): $FLIGHTDECK_WORKSPACE
Try:    export FLIGHTDECK_URL=http://127.0.0.1:$PORT FLIGHTDECK_TOKEN=\$(sed -n 's/^FLIGHTDECK_USER_TOKENS=//p' $FLIGHTDECK_DATA_DIR/tokens.env)
        flightdeck submit examples/tiny-demo.json --watch
MSG
wait $service_pid
