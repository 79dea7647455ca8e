"""The disk cache's marks of spec texts that parsed before (installed as the spec layer's parse cache).

A mark is keyed by the spec's text and autocuda's code (`store.key` hashes both). It only lets a process skip
parsing (and importing sympy): a spec's names and structure are checked on every construction, mark or not.
"""
from __future__ import annotations

from . import store

KIND = "specs"


def _entry(text: str) -> str:
    return store.key(f"valid spec {text}")


def parsed_before(text: str) -> bool:
    return store.read(KIND, _entry(text)) is not None


def remember_parsed(text: str) -> None:
    store.save(KIND, _entry(text), b"valid")
