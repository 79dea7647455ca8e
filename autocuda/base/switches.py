"""The check of a switch (a bool argument or attribute), which every layer of the package takes alike."""
from __future__ import annotations

from typing import Any

__all__ = ["check_switches"]


def check_switches(**switches: Any) -> None:
    """Refuse a switch that is no bool, naming it: a word such as "no" is true, and would turn it on."""
    for name, value in switches.items():
        if value is not True and value is not False:
            raise TypeError(f"{name}: expected True or False, got {value!r}")
