"""Every error autocuda raises of its own, under one base: `except autocuda.errors.AutocudaError` catches them all.

Each class keeps the builtin base that callers caught before (a SpecError is a ValueError, a KernelArgumentError a
TypeError, an UnsafeCachePath an OSError, ...). Errors in a spec name where the mistake is (file, field,
offending symbol), not where in our code it was noticed.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["AutocudaError", "SpecError", "ConstantRangeError", "LiteralError", "PrintError", "KernelArgumentError",
           "CompileError", "NvrtcError", "DriverError", "RecordError", "NIRError", "UnsafeCachePath", "CacheWarning"]


class AutocudaError(Exception):
    """The base of every error and warning class of autocuda."""


class SpecError(AutocudaError, ValueError):
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
        return _rebuild, (self.message, self.source, self.field, self.symbol, type(self))

    def with_source(self, source: str, field_prefix: str = "") -> SpecError:
        """A copy located in `source`, with `field_prefix` put before the field (for nested records)."""
        field = f"{field_prefix}.{self.field}" if field_prefix and self.field else (field_prefix or self.field)
        return type(self)(self.message, source=source, field=field, symbol=self.symbol)


def _rebuild(message: str, source: str, field: str, symbol: str | None, kind: type[SpecError] = SpecError
             ) -> SpecError:
    return kind(message, source=source, field=field, symbol=symbol)


class ConstantRangeError(SpecError):
    """A spec whose equations, their constants folded, hold a number that one dtype's kernels cannot represent (a
    wider dtype's may)."""


class LiteralError(AutocudaError, ValueError):
    """A number cannot be written as a constant of a dtype: non-finite, or beyond its range."""


class PrintError(AutocudaError, ValueError):
    """An expression has no C spelling in a dtype."""


class KernelArgumentError(AutocudaError, TypeError):
    """A launch argument does not match the kernel's declared parameter."""


class CompileError(AutocudaError, RuntimeError):
    """The CUDA compiler refused generated source; the message holds its diagnostics and the source."""


class NvrtcError(AutocudaError, RuntimeError):
    """NVRTC refused a program; the message holds its log."""


class DriverError(AutocudaError, RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


class RecordError(AutocudaError, ValueError):
    """A stored kernel record that is not what `KernelRecord.to_json` writes; the message names the field."""


class NIRError(AutocudaError, ValueError):
    """A NIR graph or file that autocuda.nir refuses, or a node of an imported graph that fails on its input; the
    message names the node (and field) and the rule it breaks."""


class UnsafeCachePath(AutocudaError, OSError):
    """A folder or file of the cache that this user does not control alone: reading it could run what another
    user wrote."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path} {problem}")
        self.path, self.problem = path, problem


class CacheWarning(AutocudaError, UserWarning):
    """The cache (or part of it) is not used, being refused or not writable (this user's fallback cache, or a
    private temporary folder, serves instead), or it lies below a folder another user can rename entries of."""
