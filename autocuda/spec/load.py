"""Specs from text and files: TOML text, a spec file, or a shipped spec by name -> `NeuronSpec`. Every error is a
`SpecError` naming the source and the field; a file is read again when it changed."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import SpecError
from ..base.lazy import lazy_import
from ..base.resources import resource_dir
from .model import NeuronSpec
from .names import spec_name_problem

# TOML is read only when a spec is loaded from text: a layer of a traced or cached spec never imports the parser.
if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
else:
    tomllib = lazy_import("tomllib" if sys.version_info >= (3, 11) else "tomli")

__all__ = ["as_spec", "is_spec_path", "list_specs", "load_spec", "spec_argument", "spec_from_toml"]

# The keys a TOML spec may have: the spec's fields, less where it came from (set by the loader) and `writes_output`
# (a variant a layer makes of a spec whose output is not the spike, never a file's)
_TOML_KEYS = tuple(f.name for f in dataclasses.fields(NeuronSpec) if f.name not in ("origin", "writes_output"))

# A spec file is at most this many bytes (the largest shipped one is under 2 KiB): a larger file, or a path that is
# not a regular file (a FIFO, a device, a directory), is refused before it can block or fill memory
MAX_SPEC_BYTES = 2**20


def spec_from_toml(text: str, *, source: str = "<toml>", default_name: str | None = None) -> NeuronSpec:
    """Parse TOML text into a NeuronSpec; every error is a SpecError naming `source` and the field."""
    if not isinstance(text, str):
        raise TypeError(f"spec_from_toml: expected the TOML text as a str, got {type(text).__name__}"
                        + (" (decode bytes first)" if isinstance(text, (bytes, bytearray)) else ""))
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"invalid TOML: {err}", source=source) from None
    except RecursionError:
        raise SpecError("invalid TOML: arrays or tables nested too deeply", source=source) from None
    for key in data:
        if key not in _TOML_KEYS:
            close = difflib.get_close_matches(key, _TOML_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(_TOML_KEYS)})"
            raise SpecError(f"unknown key '{key}'{hint}", source=source, field=key, symbol=key)
    if "name" not in data and default_name is None:
        raise SpecError("missing 'name'", source=source, field="name")
    if "charge" not in data and "ode" not in data:
        raise SpecError("missing 'charge' (or [ode])", source=source, field="charge")
    fields = {"name": default_name, **data, "origin": source}
    if "name" not in data and spec_name_problem(default_name) is not None:
        _refuse_stem_name(fields, source)
    return NeuronSpec(**fields)


def _refuse_stem_name(fields: dict[str, Any], source: str) -> None:
    """A file without `name` whose stem cannot name a spec: refused, and with the spec's own first mistake, if
    it has one (checked under a valid name), so that renaming the file is not the only fix the user sees."""
    stem = fields["name"]
    advice = (f"the file name {stem!r} is the spec's name when it has no 'name' field, and it cannot be one: "
              f"{spec_name_problem(stem)}; add name = \"...\"")
    try:
        NeuronSpec(**{**fields, "name": "unnamed"})
    except SpecError as err:
        raise SpecError(f"{err.message}; and field 'name': {advice}", source=source, field=err.field,
                        symbol=err.symbol) from None
    raise SpecError(advice, source=source, field="name", symbol=stem)


def _read_file(path: Path, source: str) -> bytes:
    """The bytes of a spec file: opened without blocking (a FIFO would wait for a writer), then checked on the
    open descriptor, so the file checked is the file read: a regular file of at most MAX_SPEC_BYTES."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            raise SpecError(f"not a regular file ({kind}): a spec is read from a regular file", source=source)
        with open(descriptor, "rb", closefd=False) as file:
            data = file.read(MAX_SPEC_BYTES + 1)  # never more than one byte past the limit, however the file grows
    finally:
        os.close(descriptor)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"larger than {MAX_SPEC_BYTES} bytes, the limit of a spec file", source=source)
    return data


@functools.lru_cache(maxsize=256)
def _load_file(path: Path, source: str, stamp: tuple[int, int]) -> NeuronSpec:
    try:
        text = _read_file(path, source).decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"not UTF-8 text: {err}", source=source) from None
    return spec_from_toml(text, source=source, default_name=path.stem)


def _load_path(path: Path, source: str) -> NeuronSpec:
    stat = path.stat()  # FileNotFoundError for a missing file, as open() would
    return _load_file(path.resolve(), source, (stat.st_mtime_ns, stat.st_size))


@functools.cache
def _shipped() -> dict[str, Path]:
    """The shipped specs' files by name key, listed once a process (the folder is part of the package; a file's
    contents are read again when it changes: `_load_path`)."""
    return {_key(p.stem): p for p in sorted(resource_dir("neuron_specs").glob("*.toml"))}


def _key(name: str) -> str:
    # 'ParametricLIF', 'parametric_lif' and 'parametric-lif' all find parametric_lif.toml
    return name.lower().replace("_", "").replace("-", "")


def is_spec_path(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether `load_spec` reads this as a file path (else as a shipped spec's name)."""
    if type(name_or_path) is not str:  # a path object (str first: this is asked on every call by name)
        return isinstance(name_or_path, os.PathLike) or is_spec_path(os.fspath(name_or_path))
    return name_or_path.endswith(".toml") or "/" in name_or_path or os.sep in name_or_path


def as_spec(spec: Any) -> NeuronSpec:
    """A caller's `spec` argument: a NeuronSpec, or a shipped spec's name or a spec file's path (`load_spec`);
    anything else a TypeError naming it."""
    if isinstance(spec, str):
        return load_spec(spec)
    if not isinstance(spec, NeuronSpec):
        raise TypeError(f"spec: expected a NeuronSpec, a shipped spec's name or a .toml path, got "
                        f"{type(spec).__name__}")
    return spec


def load_spec(name_or_path: str | os.PathLike[str]) -> NeuronSpec:
    """Load a TOML spec file, or a shipped spec by (case-insensitive) name, e.g. 'lif' or 'Izhikevich'. A file
    is read again when its modification time or size changed since it was last loaded."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"load_spec: expected a spec's name or a path, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path)
    # A spec's text is not a name or a path (a spec has several lines): say what reads it, rather than looking for a
    # file or a shipped spec named by the whole text
    if isinstance(name_or_path, str) and "\n" in text:
        raise SpecError("expected a shipped spec's name or a spec file's path, got a spec's TOML text: read it with "
                        "autocuda.spec_from_toml(text) and pass the NeuronSpec", source="<toml text>", field="name")
    if is_spec_path(name_or_path):
        return _load_path(Path(text), text)
    shipped = _shipped()
    path = shipped.get(_key(text))
    if path is None:
        known = ", ".join(p.stem for p in shipped.values())
        raise SpecError(f"no shipped spec named {text!r} (shipped: {known})", source=text, field="name", symbol=text)
    return _load_path(path, path.name)


def spec_argument(name_or_path: str) -> NeuronSpec:
    """The spec a command-line argument names, as `autocuda show` and the benchmark's `--workloads FILE` read it:
    `FILE.py` or `FILE.py:FUNCTION` runs the file (the user's own code, as `python FILE` would) and takes its
    neuron; anything else is `load_spec`'s (a TOML file or a shipped spec's name)."""
    if name_or_path.endswith(".py") or ".py:" in name_or_path:
        from .python import load_python_spec

        return load_python_spec(name_or_path)
    return load_spec(name_or_path)


def list_specs() -> list[tuple[str, str]]:
    """(name, doc) of every shipped spec, sorted by name."""
    return sorted((spec.name, spec.doc) for spec in (_load_path(p, p.name) for p in _shipped().values()))
