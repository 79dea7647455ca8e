"""A layer's configuration (`NeuronConfig`) and its kernels launched on flat tensors (`KernelCall`, `BoundLaunch`):
x is [T, N] ([N] for one step), states [N], tensor parameters [N] or [1] (shared), scalars floats; names follow
`codegen.neuron_kernel`. Nothing here synchronises with the device but the one-time timing of layouts (`tuning`)."""
from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..base.errors import ConstantRangeError, KernelArgumentError, LiteralError, SpecError
from ..codegen.broadcast import CHANNEL_KEYS, CORRECTION_KEYS, PER_CHANNEL, PER_NEURON, Broadcast, gradient_groups
from ..codegen.dtypes import get_dtype
from ..codegen.layout import FIELDS, Layout
from ..spec.draws import makes_draws
from ..spec.model import NeuronSpec, Reset, spec_text
from ..spec.surrogate import Surrogate
from ..toolchain.cnames import DRAW_KEYS, input_key
from ..toolchain.launch import current_stream_ptr
from . import tuning
from .records import KernelRecord, kernel_record

Flags = tuple[bool | str, ...]  # a kind's options in `KIND_OPTIONS` order: bools, and BPTT's `gradients` (a word)
# channels: zeros, one per channel (sums); groups: one sum per GRADIENT_GROUP neurons (a shared parameter's gradient)
OUTPUT_KINDS = ("vector", "sequence", "checkpoints", "channels", "groups")


def output_kind(name: str) -> str:
    """How an output is shaped, from its name: [(T - 1) // K, N] checkpoints (`checkpoint_rows`), [T, N]
    sequences, else [N]."""
    if name.endswith("_checkpoints"):
        return "checkpoints"
    return "sequence" if name.endswith("_seq") else "vector"


def checkpoint_rows(steps: Any, every: int) -> Any:
    """Rows of a `<state>_checkpoints` output over `steps` steps, one every `every`: the states after steps K-1, 2K-1,
    ... before the last step (the states after it are the final states, which no backward segment starts from)."""
    return torch.sym_max(steps - 1, 0) // every


FINAL = "final"  # a final state [N]: in the neuron shape a call gives, not a view, so its holder can detach it


class Recipe:
    """How to fill one kernel's arguments (`_source`), worked out once; outputs come back in parameter order."""
    def __init__(self, kernel: KernelRecord, storage: torch.dtype, sums: Mapping[str, str] | None = None):
        self.kernel = kernel
        self.sources = tuple(_source(name, param, sums or {}) for name, param in kernel.cparams.items())
        self.outputs = tuple(name for source, name, _ in self.sources if source in OUTPUT_KINDS)
        self.allocations = tuple((FINAL if source == "vector" and name.endswith("_final") else source,
                                  None if dtype == storage else dtype)
                                 for source, name, dtype in self.sources if source in OUTPUT_KINDS)

    def arguments(self, binding: Binding, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None,
                  final_shape: Sequence[int] | None = None) -> tuple[list[torch.Tensor], tuple]:
        """(outputs, parameter values in order); final states shaped `final_shape` (N contiguous values) if given."""
        produced = []  # from `like`: less host time than `torch.empty`; contiguous, as `like` must be (below)
        for kind, dtype in self.allocations:
            if kind == "sequence":
                produced.append(torch.empty_like(like) if dtype is None else torch.empty_like(like, dtype=dtype))
                continue
            if kind == "channels":  # sums the kernel adds into
                produced.append(like.new_zeros(int(args[binding.channels]), dtype=dtype))
                continue
            if kind == "checkpoints":
                size: Any = (checkpoint_rows(steps or 0, self.kernel.checkpoint_steps), n)
            elif kind == "groups":
                size = gradient_groups(n)
            else:  # a vector, or a final state (neuron-shaped where `final_shape` is given)
                size = final_shape if kind == FINAL and final_shape is not None else n
            produced.append(like.new_empty(size) if dtype is None else like.new_empty(size, dtype=dtype))
        pool: list[Any] = [n, steps, *map(_data_ptr, produced)]  # by kind; `arrange` orders it: no branch per value
        counts = binding.counts(args, n, steps, self.kernel.checkpoint_steps)
        for (at, name, dtype), size in zip(binding.inputs, binding.sizes):
            value = args[at]
            if value is None or value.dtype != dtype or not value.is_contiguous():
                self._refuse(name, value, dtype)
            if value.numel() != counts[size]:  # the kernel reads exactly this many: a smaller tensor, read past its end
                self._refuse_size(name, value, counts[size], n, steps)
            pool.append(value.data_ptr())
        pool += args
        for at in binding.integers:
            pool[at - len(args)] = int(pool[at - len(args)])
        return produced, binding.arrange(pool)

    def _refuse(self, name: str, value: Any, dtype: torch.dtype) -> None:
        if value is None:
            raise KeyError(f"kernel {self.kernel.kernel_name} needs argument {name!r}")
        raise KernelArgumentError(f"{name}: expected a contiguous {dtype} tensor, got {value.dtype} "
                                  f"(contiguous: {value.is_contiguous()})")

    def _refuse_size(self, name: str, value: torch.Tensor, count: int, n: int, steps: int | None) -> None:
        sizes = f"N = {n}" if steps is None else f"T = {steps}, N = {n}"
        raise KernelArgumentError(f"{name}: expected a tensor of {count} elements for a call of {sizes} "
                                  f"(kernel {self.kernel.kernel_name}), got shape {tuple(value.shape)}")


_data_ptr = torch.Tensor.data_ptr


def _source(name: str, param: Any, sums: Mapping[str, str]) -> tuple[str, str, Any]:
    """(source, name, dtype): a size (N, T), a scalar or input of the caller's, or an output kind (`OUTPUT_KINDS`;
    `sums`: the kind of each output the kernel sums, "channels" or "groups")."""
    if name in ("N", "T"):
        return "size", name, None
    if not param.pointer:
        return "scalar", name, None
    kind = "input" if param.const else sums.get(name) or output_kind(name)
    return kind, name, param.torch_dtype


# What an input of a kernel holds, by `Binding.sizes` (indices into `Binding.counts`): a sequence ([T, N], [N] for one
# step), a vector ([N]: a state, a final state's gradient, a per-neuron parameter), one value (a shared parameter), one
# per channel (a per-channel parameter, a correction term), a state's checkpoints ([rows, N]: `checkpoint_rows`)
SEQUENCE, VECTOR, ONE, CHANNELS, CHECKPOINTS = range(5)


def _input_size(name: str, tensors: Mapping[str, Broadcast]) -> int:
    if name in tensors:
        kind = tensors[name]
        return CHANNELS if kind == PER_CHANNEL else VECTOR if kind == PER_NEURON else ONE
    if name in CORRECTION_KEYS:
        return CHANNELS
    return {"checkpoints": CHECKPOINTS, "sequence": SEQUENCE}.get(output_kind(name), VECTOR)


class Binding:
    """A recipe bound to values given in `names` order: where each input stands, and `arrange`, which orders a pool."""
    def __init__(self, recipe: Recipe, names: tuple[str, ...], tensors: Mapping[str, Broadcast] | None = None):
        at = {name: i for i, name in enumerate(names)}
        missing = [name for source, name, _ in recipe.sources if source in ("input", "scalar") and name not in at]
        if missing:
            raise KeyError(f"kernel {recipe.kernel.kernel_name} needs argument {missing[0]!r}")
        sources = recipe.sources
        self.inputs = tuple((at[name], name, dtype) for source, name, dtype in sources if source == "input")
        self.sizes = tuple(_input_size(name, tensors or {}) for _, name, _ in self.inputs)  # (`SEQUENCE`, ...)
        self.checkpoints = CHECKPOINTS in self.sizes
        params = recipe.kernel.cparams
        self.integers = tuple(at[name] for source, name, _ in sources  # sizes among the ops' float[] scalars
                              if source == "scalar" and params[name].dtype is None)
        self.channels = at.get(CHANNEL_KEYS[0], -1)  # where the channel count stands (kernels that sum per channel)
        self.inner = at.get(CHANNEL_KEYS[1], -1)  # and the neurons per run of one channel
        pool = ["N", "T", *recipe.outputs, *(name for _, name, _ in self.inputs), *names]
        self.order = tuple(pool.index(name) for _, name, _ in sources)  # each parameter's place in the pool
        self.arrange = operator.itemgetter(*self.order)  # >= 2: a tuple

    def counts(self, args: Sequence[Any], n: int, steps: int | None, every: int) -> tuple[int, ...]:
        """The elements a call's inputs hold, by size (`SEQUENCE`, ...); channel sizes that would divide by zero in the
        kernel refused."""
        channels = -1
        if self.channels >= 0:
            channels, inner = int(args[self.channels]), int(args[self.inner])
            if n and (channels < 1 or inner < 1 or n % (channels * inner)):
                raise KernelArgumentError(f"{CHANNEL_KEYS[0]}, {CHANNEL_KEYS[1]}: expected sizes of at least 1 whose "
                                          f"product divides N = {n}, got {channels} and {inner}")
        # `checkpoint_rows` in plain ints: a launch's sizes are numbers (torch.sym_max costs a call each launch)
        rows = max((steps or 0) - 1, 0) // every * n if self.checkpoints else -1
        return (n if steps is None else steps * n, n, 1, channels, rows)


@dataclass(frozen=True)
class NeuronConfig:
    """A neuron layer's configuration (hashable): all else derives from it. `reference`: the torch reference runs it."""
    spec: NeuronSpec
    surrogate: Surrogate
    reset: Reset
    detach_reset: bool = False
    constants: tuple[tuple[str, float], ...] = ()
    tensors: tuple[tuple[str, Broadcast], ...] = ()  # runtime tensor parameters: (name, how it spreads)
    replay_charge: bool = False  # multi-step kernels save no h; backward replays it from x (`kernels.neuron_kernel`)
    reference: bool = False
    _kernels: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    _recipes: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    _tuned: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def derivation(self):
        from ..codegen.kernels import derivation
        return derivation(self.spec, self.reset, self.detach_reset, dict(self.constants))

    @functools.cached_property
    def text(self) -> str:
        """Everything that selects this layer's kernels, as stable text."""
        return repr((spec_text(self.spec), self.surrogate.key(), self.reset, self.detach_reset, self.constants,
                     self.tensors, *(("replay_charge",) if self.replay_charge else ())))

    @functools.cached_property
    def key(self) -> str:
        """A key stable across processes: the spec's name and a digest of `text`."""
        digest = hashlib.sha1(self.text.encode()).hexdigest()[:16]
        return f"reference_{self.spec.name}_{digest}" if self.reference else f"{self.spec.name}_{digest}"

    @functools.cached_property
    def parameters(self) -> tuple[tuple[str, str], ...]:
        """(name, role) in spec order: 'constant' (folded in), 'tensor', 'scalar' or 'unused' (v_reset if not hard)."""
        tensors, hard = dict(self.tensors), self.reset == "hard"
        return tuple((p.name, "constant" if p.kind == "constant" else "tensor" if p.name in tensors
                      else "unused" if p.name == "v_reset" and not hard else "scalar") for p in self.spec.params)

    @functools.cached_property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.tensors)

    @functools.cached_property
    def scalars(self) -> tuple[str, ...]:
        """By-value parameters in spec order, then, for a step that draws, each call's seed words and first step."""
        draws = DRAW_KEYS if makes_draws(self.spec) else ()
        return tuple(name for name, role in self.parameters if role == "scalar") + draws

    @functools.cached_property
    def op_scalars(self) -> tuple[str, ...]:
        """The op's float[] scalars: `scalars`, then `CHANNEL_KEYS` where a tensor parameter is per channel."""
        return self.scalars + (CHANNEL_KEYS if any(kind == PER_CHANNEL for _, kind in self.tensors) else ())

    @functools.cached_property
    def learnable(self) -> tuple[str, ...]:
        """The parameters whose per-neuron gradient partials backward returns, in order: not a learnable v_reset
        under a soft reset or none, which the equations read as 0 (`parameters` calls it unused)."""
        roles = dict(self.parameters)
        return tuple(p.name for p in self.spec.params
                     if p.learnable and p.name not in dict(self.constants) and roles[p.name] != "unused")

    @functools.cached_property
    def op_inputs(self) -> tuple[str, ...]:
        """The op's inputs in order: step inputs, initial states (tensors or numbers), tensor parameters, scalars."""
        return (*self.input_keys, *(f"{s}_init" for s in self.state_names), *self.tensor_names, *self.op_scalars)

    @functools.cached_property
    def reference_step(self) -> tuple[Any, Mapping[str, Any]]:
        """The torch reference's derived step (prepared for evaluation) and the parameters' symbols by name."""
        from ..spec.system import step_system  # derivation: the reference path only
        from .reference import prepare
        system = step_system(self.spec, self.reset, dict(self.constants))
        try:
            prepare(system), self.surrogate.gradient_of_x()
        except LiteralError as error:  # refused as the kernels refuse it (`codegen.kernels`)
            raise ConstantRangeError(f"{error}: the equations, with their constants folded, hold a number no dtype "
                                     "represents", source=self.spec.origin, field="params") from None
        except SpecError as error:  # the surrogate's, named by the spec's source
            raise error.with_source(self.spec.origin) if error.source == "<python>" else error from None
        return system, dict(self.spec.parsed().param_symbols)

    def kernel(self, kind: str, dtype: Any, **options: Any) -> KernelRecord:
        """The kernel for these flags and layout fields: from this object, else the disk cache, else generated."""
        layout = Layout.of({k: v for k, v in options.items() if k in FIELDS})
        flags = tuple(sorted((k, v) for k, v in options.items() if k not in FIELDS))
        key = (kind, get_dtype(dtype).name, flags, layout)
        found = self._kernels.get(key)
        if found is None:
            chosen = {**dict(flags), **layout.options()}
            text = repr(("neuron kernel", self.text, kind, get_dtype(dtype).name, sorted(chosen.items())))
            found = self._kernels[key] = kernel_record(text, lambda: self._generate(kind, dtype, chosen))
        return found

    def _generate(self, kind: str, dtype: Any, options: Mapping[str, Any]):
        from ..codegen.kernels import neuron_kernel  # the derive and render stages: only for kernels not on disk
        return neuron_kernel(self.spec, kind, dtype, reset=self.reset, detach_reset=self.detach_reset,
                             constants=dict(self.constants), surrogate=self.surrogate,
                             tensors=list(self.tensor_names),
                             per_neuron=[n for n, kind in self.tensors if kind == PER_NEURON],
                             per_channel=[n for n, kind in self.tensors if kind == PER_CHANNEL],
                             replay_charge=self.replay_charge, **options)

    def recipe(self, kind: str, dtype: torch.dtype, flags: Flags, layout: Layout) -> Recipe:
        """A kernel's launch recipe; `flags` in `KIND_OPTIONS` order, trailing ones at their defaults left out."""
        key = (kind, dtype, flags, layout)
        found = self._recipes.get(key)
        if found is None:
            options = dict(zip(KIND_OPTIONS[kind], flags))
            kernel = self.kernel(kind, dtype, **options, **layout.options())
            found = self._recipes[key] = Recipe(kernel, dtype, self.summed_outputs)
        return found

    @functools.cached_property
    def channel_sums(self) -> frozenset[str]:
        """Backward's outputs summed per channel in the kernel: the gradients of per-channel parameters."""
        return frozenset(f"grad_{n}" for n, kind in self.tensors if kind == PER_CHANNEL)

    @functools.cached_property
    def group_sums(self) -> frozenset[str]:
        """Backward's outputs summed per group of neurons in the kernel (`GRADIENT_GROUP`): the gradients of
        shared parameters."""
        return frozenset(f"grad_{n}" for n, kind in self.tensors if kind not in (PER_NEURON, PER_CHANNEL))

    @functools.cached_property
    def summed_outputs(self) -> dict[str, str]:
        """The output kind of each output the kernel sums (`OUTPUT_KINDS`)."""
        return {**dict.fromkeys(self.channel_sums, "channels"), **dict.fromkeys(self.group_sums, "groups")}

    @functools.cached_property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spec.states)

    @functools.cached_property
    def input_keys(self) -> tuple[str, ...]:
        return tuple(input_key(name) for name in self.spec.inputs)


KIND_OPTIONS = {"fptt": ("store_state_seq", "save_for_backward", "given_inits", "final_states"),
                "step-forward": ("store_state_seq", "save_for_backward", "given_inits", "final_states"),
                "bptt": ("grad_state_seq", "grad_finals", "given_inits", "gradients"),
                "step-backward": ("grad_state_seq", "grad_finals", "given_inits")}


class KernelCall:
    """One kernel of a layer, called with arguments in `names` order; bound once per shape and alignment (`bind`)."""
    def __init__(self, config: NeuronConfig, kind: str, flags: Flags, names: tuple[str, ...]):
        self.config, self.kind, self.flags, self.names = config, kind, flags, names
        self._bound: dict[tuple, tuple[Recipe, Binding]] = {}
        self._launches: dict[tuple, BoundLaunch] = {}

    def __call__(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str,
                 final_shape: Sequence[int] | None = None) -> tuple[tuple[str, ...], list[torch.Tensor]]:
        """(output names, outputs) in parameter order; final states shaped `final_shape` where it is given."""
        bound = self.bound(args, like, n, steps, backend)
        return bound.recipe.outputs, bound(args, like, final_shape)

    def bound(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str) -> BoundLaunch:
        """The launch of a call of this shape, device and alignment: the one kept, else bound now (`bind`)."""
        addresses = 0  # every tensor's address ORed: its low bits are the alignment the layouts ask about
        for value in args:
            if isinstance(value, torch.Tensor):
                addresses |= value.data_ptr()
        key = (like.dtype, n, steps, backend, like.get_device(), addresses & 15)
        found = self._launches.get(key)
        return found if found is not None else self.bind(args, like, n, steps, backend, key)

    def bind(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str,
             key: tuple | None = None, layout: Layout | None = None) -> BoundLaunch:
        """What a call of this shape runs, with `layout` or its own; kept under `key` except in a CUDA graph capture,
        which takes the fixed rules' layout where a later call would time one."""
        if layout is None:
            layout = self.layout(args, like, n, steps, backend)
        found = self._bound.get((like.dtype, layout))
        if found is None:
            recipe = self.config.recipe(self.kind, like.dtype, self.flags, layout)
            found = self._bound[(like.dtype, layout)] = (recipe, Binding(recipe, self.names,
                                                                              dict(self.config.tensors)))
        bound = BoundLaunch(*found, like, n, steps, backend)
        if key is not None and not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            if len(self._launches) >= _MAX_LAUNCHES:  # shapes that vary without end must not grow this
                self._launches.clear()
            self._launches[key] = bound
        return bound

    def layout(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str) -> Layout:
        """The fastest timed layout (`tuned`) on a GPU where `tuning.timed` says and it fits, else the fixed rules'."""
        tensors = _tensors(args)
        if backend == "cuda" and tuning.timed(n, steps) and not torch.cuda.is_current_stream_capturing():
            tuned = self.tuned(args, like, n, steps or 0, tensors)
            if tuned is not None:
                return tuning.for_steps(tuned, steps)
        return tuning.fixed_rule(n, steps, like.dtype, tensors)

    def tuned(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int, tensors: list[torch.Tensor]
              ) -> Layout | None:
        """The layout timed fastest (or read from disk) once per power-of-two group of N and T, so that varying
        sequence lengths are timed once; None where it does not fit N or the tensors' alignment."""
        config, aligned = self.config, functools.partial(tuning.aligned, tensors)
        group = (n.bit_length(), steps.bit_length())
        key = (self.kind, like.dtype, self.flags, group)
        found = config._tuned.get(key)
        if found is None:
            layouts = [Layout.of(c) for c in tuning.candidates(n, like.dtype, aligned, tuning.long_loop(n, steps),
                                                               makes_draws(config.spec))]
            text = repr((config.text, self.kind, str(like.dtype), self.flags, group))

            def run(layout: Layout) -> None:
                self.bind(args, like, n, steps, "cuda", layout=layout)(args, like)
            found = config._tuned[key] = tuning.fastest(text, like.device, layouts, run)
        return found if tuning.fits(found, n, like.dtype.itemsize, aligned) else None


_MAX_LAUNCHES = 256


class BoundLaunch:
    """One kernel for one call shape, device and alignment, with grid, block and launcher found once per shape."""
    def __init__(self, recipe: Recipe, binding: Binding, like: torch.Tensor, n: int, steps: int | None,
                 backend: str):
        self.recipe, self.binding, self.n, self.steps = recipe, binding, n, steps
        self.like_dtype = like.dtype  # the storage dtype of outputs that name none
        kernel = recipe.kernel
        self.grid, self.block = ((-(-n // kernel.lanes) + kernel.block - 1) // kernel.block,), (kernel.block,)
        self.runs = bool(n) and steps != 0
        self.device = like.get_device()
        self.launcher = kernel.cuda_launcher(self.device) if backend == "cuda" and self.runs else None
        self.backend = backend

    def __call__(self, args: Sequence[Any], like: torch.Tensor, final_shape: Sequence[int] | None = None
                 ) -> list[torch.Tensor]:
        recipe, n = self.recipe, self.n
        produced, values = recipe.arguments(self.binding, args, like, n, self.steps, final_shape)
        launcher = self.launcher
        if launcher is not None:
            launcher(self.grid, self.block, values, current_stream_ptr(self.device))
        elif self.runs:  # the host runner
            if not like.is_cpu:
                raise ValueError(f"backend {self.backend!r} runs kernels on CPU tensors; got tensors on {like.device} "
                                 "(use backend='reference' or move them to the CPU)")
            import numpy as np  # the host runner's packing only: a GPU process need not import NumPy
            kernel = recipe.kernel
            packed = tuple(np.uint64(v) if p.pointer else p.pack(v) for v, p in zip(values, kernel.cparams.values()))
            kernel.launch(self.grid, self.block, packed, like.device, self.backend)
        return produced


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    return [t for t in values if isinstance(t, torch.Tensor) and t.dim()]
