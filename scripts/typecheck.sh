#!/usr/bin/env bash
# mypy over flightdeck.service, the pure half in flightdeck/ (flightdeck.recipe, .preflight, .memory,
# .launch, .contracts, .inventory, .statuses) and flightdeck.cli (strict on the service and the pure half). mypy cannot follow the
# editable install's import hook (package-dir maps flightdeck.service to service/), so it reads a view
# of symlinks with the installed layout: build/typecheck/flightdeck/{service,worker,cli,...}.
set -euo pipefail
cd "$(dirname "$0")/.."
view=build/typecheck
rm -rf "$view"
mkdir -p "$view/flightdeck"
for entry in flightdeck/*; do
    ln -s "$PWD/$entry" "$view/flightdeck/$(basename "$entry")"
done
for directory in service worker cli; do
    ln -s "$PWD/$directory" "$view/flightdeck/$directory"
done
MYPYPATH="$view" exec mypy -p flightdeck.service -p flightdeck.recipe -p flightdeck.preflight -p flightdeck.memory -p flightdeck.launch -m flightdeck.contracts -m flightdeck.inventory -m flightdeck.statuses -p flightdeck.cli "$@"
