"""Flightdeck: the one import name of the distribution.

The code lives in the repository's service/, worker/ and cli/ directories, installed as
flightdeck.service, flightdeck.worker and flightdeck.cli (pyproject.toml's package-dir, setup.py). This
package itself stays empty apart from the stable paths users write, such as flightdeck.callback.
"""
