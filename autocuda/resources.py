"""Where the shipped data folders are: inside the package when installed, at the repository root in a checkout."""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """`templates` or `neuron_specs`: <package>/<name> in a wheel, <repo>/<name> in a source tree."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autocuda data folder {name!r} not found next to {_PACKAGE}")
