"""Flightdeck: the one import name of the distribution.

The code lives in the repository's service/, worker/ and cli/ directories, installed as
flightdeck.service, flightdeck.worker and flightdeck.cli (pyproject.toml's package-dir, setup.py). This
package itself holds the stable paths users write, such as flightdeck.callback, and the pure half every
side imports (flightdeck.recipe, flightdeck.preflight, flightdeck.memory, flightdeck.launch,
flightdeck.contracts, flightdeck.inventory, flightdeck.statuses: no web, database or training library).
"""
