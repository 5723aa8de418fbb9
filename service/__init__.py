"""Flightdeck control plane: scheduler, leases, reports, HTTP API, dashboard (the recipe, preflight and
launch plan it uses are the pure half in flightdeck/)."""
