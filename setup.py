"""The package list of the one import name, computed from the directories (pyproject.toml has the rest).

pyproject's package-dir maps flightdeck.service -> service/, flightdeck.worker -> worker/,
flightdeck.cli -> cli/; setuptools' own package finder knows only directory names, so the subpackages
under each are listed here with the prefix, and a new subpackage needs no edit.
"""

from setuptools import find_packages, setup

DIRECTORIES = {
    "flightdeck": "flightdeck",
    "flightdeck.service": "service",
    "flightdeck.worker": "worker",
    "flightdeck.cli": "cli",
}

setup(
    packages=[
        name
        for package, directory in DIRECTORIES.items()
        for name in [package, *(f"{package}.{sub}" for sub in find_packages(directory))]
    ]
)
