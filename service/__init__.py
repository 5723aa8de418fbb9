"""Flightdeck control plane: recipe schema, preflight, scheduler, HTTP API, CLI."""
