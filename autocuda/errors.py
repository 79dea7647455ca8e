"""Errors raised for bad user input: a spec, an expression, a surrogate.

One class, so callers can catch every user mistake with one `except`, and every message names where the
mistake is (file, field, offending symbol) instead of where in our code it was noticed.
"""
from __future__ import annotations

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A spec (TOML file or Python object) is invalid.

    `source` is the file path or '<python>'; `field` the spec field ('charge', 'params.tau.default', ...);
    `symbol` the offending name or token, or None when the whole field is wrong.
    """

    def __init__(self, message: str, *, source: str = "<python>", field: str = "", symbol: str | None = None):
        self.message = message
        self.source = source
        self.field = field
        self.symbol = symbol
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.source}: field '{self.field}'" if self.field else self.source
        return f"{where}: {self.message}"

    def __reduce__(self):
        # Keyword-only constructor: teach pickle (multiprocessing, pytest-xdist) how to rebuild us.
        return _rebuild, (self.message, self.source, self.field, self.symbol)

    def with_source(self, source: str, field_prefix: str = "") -> SpecError:
        """A copy located in `source`, with `field_prefix` put before the field (for nested records)."""
        field = f"{field_prefix}.{self.field}" if field_prefix and self.field else (field_prefix or self.field)
        return SpecError(self.message, source=source, field=field, symbol=self.symbol)


def _rebuild(message: str, source: str, field: str, symbol: str | None) -> SpecError:
    return SpecError(message, source=source, field=field, symbol=symbol)
