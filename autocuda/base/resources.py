"""Where the shipped data folders are: inside the package, each beside the code that reads it."""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
# data folder -> its place in the package: the kernel skeletons (read by codegen.render), the shipped neuron specs
# (read by spec.load)
FOLDERS = {"templates": "codegen/templates", "neuron_specs": "spec/neuron_specs"}


def resource_dir(name: str) -> Path:
    """The package's data folder `name` (`templates` or `neuron_specs`)."""
    if name not in FOLDERS:
        raise FileNotFoundError(f"autocuda has no data folder {name!r}: it has {', '.join(FOLDERS)}")
    path = _PACKAGE / FOLDERS[name]
    if not path.is_dir():
        raise FileNotFoundError(f"autocuda data folder {name!r} not found at {path}")
    return path
