"""Running generated neuron kernels on flat tensors: allocate outputs, launch, return them by name.

This is the launch stage for neurons. Callers (the ops, the test helpers) pass x as [T, N] (or [N] for a
single step), states as [N], tensor parameters as [N] (one per neuron) or [1] (shared), scalars as floats.
Names follow `autocuda.codegen.neuron_kernel`'s docstring. Nothing here synchronises with the device, except the
one-time timing of a long loop's layouts (`runtime.tuning`).
"""
from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cnames import input_key
from ..codegen.broadcast import CHANNEL_KEYS, PER_CHANNEL, PER_NEURON, Broadcast
from ..dtypes import get_dtype
from ..errors import KernelArgumentError
from ..layout import FIELDS, REPLAY_STEPS, Layout
from ..spec.model import NeuronSpec, Reset, spec_text
from ..surrogate import Surrogate
from . import tuning
from .launch import current_stream_ptr
from .records import KernelRecord, kernel_record

# The fixed rules: the layout of a call that is not timed (`runtime.tuning` times long loops on a GPU).
VECTOR_BYTES = (8, 16, 4)       # preferred aligned access widths, in order
MIN_THREADS = 4096              # below this many threads, keep one word per thread: latency needs parallelism
# Many steps over few neurons: unrolled eight times, replayed states in 32-step segments, 16 steps of inputs
# staged in registers a block ahead, 64 threads per block (so that 16K neurons still spread over the SMs).
LONG_LOOP = Layout(block=64, replay=tuning.REPLAY, staged=16, unroll=tuning.UNROLL)
LONG_LOOP_STEPS, LONG_LOOP_NEURONS = 64, 128 * 1024
LONG_LOOP_LANES = 2             # neurons per thread there, in one vector access (staged inputs need one)
# Other loops over many neurons unroll twice: the loads of the next step issue before this step's arithmetic.
SHORT_LOOP = Layout(unroll=tuning.SHORT_UNROLL)
# Short loops over too few neurons for two per thread unroll four times: four steps' loads issue at once.
SMALL_LOOP = Layout(unroll=4)


def choose_layout(n: int, dtype: torch.dtype, tensors: list[torch.Tensor],
                  widths: tuple[int, ...] = VECTOR_BYTES) -> Layout:
    """Neurons per thread and vector access for N neurons: the first of `widths` (bytes per access) that keeps
    enough threads. Odd sizes or unaligned tensors fall back to per-lane accesses (correct for any N)."""
    size = dtype.itemsize
    for width in widths:
        lanes = width // size
        if lanes >= 2 and n % lanes == 0 and n // lanes >= MIN_THREADS \
                and all(t.data_ptr() % width == 0 for t in tensors):
            return _vector_layout(lanes)
    return _SCALAR_LAYOUT


# choose_layout's answers, built once: a Layout per call would cost more host time than the rest of the choice
_SCALAR_LAYOUT = Layout()


@functools.lru_cache(maxsize=16)
def _vector_layout(lanes: int) -> Layout:
    return Layout(lanes=lanes, vector=True)


# A kernel kind's options in `KIND_OPTIONS` order: bools, and BPTT's `gradients` (a word)
Flags = tuple[bool | str, ...]

OUTPUT_KINDS = ("vector", "sequence", "checkpoints", "channels")  # channels: zeros, one per channel (sums)


def output_kind(name: str) -> str:
    """How an output is shaped, from its name: [T // K, N] checkpoints, [T, N] sequences, else [N]."""
    if name.endswith("_checkpoints"):
        return "checkpoints"
    return "sequence" if name.endswith("_seq") else "vector"


FINAL = "final"  # a [N] output that is a final state: allocated in the neuron shape a call gives


def checkpoint_rows(steps: Any, every: int) -> Any:
    """Rows of a `<state>_checkpoints` tensor: the state after steps K-1, 2K-1, ... of T (a SymInt under
    torch.compile)."""
    return steps // every


class Recipe:
    """How to fill one kernel's arguments, worked out once from its parameter list: each parameter is a size
    (N, T), a scalar or an input tensor taken from the caller's mapping, or an output allocated here (shaped
    like the sequence, one value per neuron, or a row per `checkpoint_steps` steps, of its parameter's type).
    Outputs come back in parameter order."""

    def __init__(self, kernel: KernelRecord, storage: torch.dtype, channel_sums: frozenset[str] = frozenset()):
        self.kernel = kernel
        self.args: list[tuple[str, str, Any]] = []
        for name, param in kernel.cparams.items():
            if name in ("N", "T"):
                self.args.append(("size", name, None))
            elif not param.pointer:
                self.args.append(("scalar", name, None))
            elif param.const:
                self.args.append(("input", name, param.torch_dtype))
            else:
                self.args.append(("channels" if name in channel_sums else output_kind(name), name, param.torch_dtype))
        self.outputs = tuple(name for source, name, _ in self.args if source in OUTPUT_KINDS)
        # Every call's path walks these flat tuples. Outputs: (kind, dtype, None for the storage dtype);
        # arguments: (tag, name, dtype, output index or None).
        # A final state is allocated in the caller's neuron shape where it gives one (`arguments`): a tensor that
        # is not a view of a flat one, which its holder can detach in place.
        self.allocations = tuple((FINAL if source == "vector" and name.endswith("_final") else source,
                                  None if dtype == storage else dtype)
                                 for source, name, dtype in self.args if source in OUTPUT_KINDS)
        index = iter(range(len(self.outputs)))
        self.sources = tuple((source, name, dtype, next(index) if source in OUTPUT_KINDS else None)
                             for source, name, dtype in self.args)

    def run(self, given: Mapping[str, Any], like: torch.Tensor, n: int, steps: int | None,
            backend: str) -> dict[str, torch.Tensor]:
        """Allocate the outputs, launch, and return the outputs by name. Scalars may be any real numbers here
        (ints included); `like` is the contiguous sequence input (x or the spikes' gradient), in the storage
        dtype."""
        binding = Binding(self, tuple(given))
        args = list(given.values())
        for at in binding.scalars:
            args[at] = float(args[at])
        return dict(zip(self.outputs, BoundLaunch(self, binding, like, n, steps, backend)(args, like)))

    def arguments(self, binding: Binding, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None,
                  final_shape: Sequence[int] | None = None) -> tuple[list[torch.Tensor], tuple]:
        """The outputs, allocated, and every parameter's value in parameter order; the final states in
        `final_shape` (N values: the kernel writes them through their contiguous address) where it is given."""
        # From `like` rather than `torch.empty(shape, dtype=, device=)`, whose argument parsing costs more host
        # time, and without the dtype keyword where it is like's. `like` is the sequence input, refused below
        # unless contiguous, so a tensor laid out like it is contiguous.
        produced = []
        for kind, dtype in self.allocations:
            if kind == "vector" or kind == FINAL:
                size = n if final_shape is None or kind == "vector" else final_shape
                produced.append(like.new_empty(size) if dtype is None else like.new_empty(size, dtype=dtype))
            elif kind == "sequence":
                produced.append(torch.empty_like(like) if dtype is None else torch.empty_like(like, dtype=dtype))
            elif kind == "checkpoints":
                rows = (checkpoint_rows(steps or 0, self.kernel.checkpoint_steps), n)
                produced.append(like.new_empty(rows) if dtype is None else like.new_empty(rows, dtype=dtype))
            else:  # sums the kernel adds into
                produced.append(like.new_zeros(int(args[binding.channels]), dtype=dtype))
        # The values pooled by kind (sizes, outputs' and inputs' addresses, then the caller's values, among which
        # the scalars), then put in parameter order by one itemgetter: no loop over the parameters with a branch
        # each, no list of the scalars built per call.
        pool: list[Any] = [n, steps, *map(_data_ptr, produced)]
        for at, name, dtype in binding.inputs:
            value = args[at]
            if value is None or value.dtype != dtype or not value.is_contiguous():
                self._refuse(name, value, dtype)
            pool.append(value.data_ptr())
        pool += args
        for at in binding.integers:  # sizes among the ops' float[] scalars
            pool[at - len(args)] = int(pool[at - len(args)])
        return produced, binding.arrange(pool)

    def _refuse(self, name: str, value: Any, dtype: torch.dtype) -> None:
        if value is None:
            raise KeyError(f"kernel {self.kernel.kernel_name} needs argument {name!r}")
        raise KernelArgumentError(f"{name}: expected a contiguous {dtype} tensor, got {value.dtype} "
                                  f"(contiguous: {value.is_contiguous()})")

_data_ptr = torch.Tensor.data_ptr


class Binding:
    """A recipe's arguments filled from a caller's values given as a sequence in `names` order:
    where each input tensor and scalar stands among them, and `arrange`, which takes the parameters' values in
    order from a call's pool (N, T, the outputs' addresses, the inputs' addresses, the caller's values)."""

    def __init__(self, recipe: Recipe, names: tuple[str, ...]):
        at = {name: i for i, name in enumerate(names)}
        missing = [name for source, name, _, _ in recipe.sources if source in ("input", "scalar") and name not in at]
        if missing:
            raise KeyError(f"kernel {recipe.kernel.kernel_name} needs argument {missing[0]!r}")
        sources = recipe.sources
        self.inputs = tuple((at[name], name, dtype) for source, name, dtype, _ in sources if source == "input")
        self.scalars = tuple(at[name] for source, name, _, _ in sources if source == "scalar")
        params = recipe.kernel.cparams
        self.integers = tuple(at[name] for source, name, _, _ in sources
                              if source == "scalar" and params[name].dtype is None)
        self.channels = at.get(CHANNEL_KEYS[0], -1)  # where the channel count stands (kernels that sum per channel)
        pool = ["N", "T", *recipe.outputs, *(name for _, name, _ in self.inputs), *names]
        self.order = tuple(pool.index(name) for _, name, _, _ in sources)  # each parameter's place in the pool
        self.arrange = operator.itemgetter(*self.order)  # >= 2: a tuple


@dataclass(frozen=True)
class NeuronConfig:
    """A neuron layer's configuration: the one record of it (hashable). Everything else derives from its
    fields: the key (`key`, the ops' and the programs'), the parameters' roles and the op's argument order
    (`parameters`, `scalars`, `op_inputs`), the kernel requests (`kernel`), the launch recipes (`recipe`) and,
    through those, a native plan's words. `reference`: a configuration the torch reference runs (no kernels)."""

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
        from ..kernels import derivation

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
        """The one parameter list: each parameter of the spec with its role, in the spec's order: 'constant'
        (folded into the source), 'tensor' (a tensor argument), 'scalar' (a number by value) or 'unused' (v_reset
        under another reset than a hard one)."""
        tensors, hard = dict(self.tensors), self.reset == "hard"
        return tuple((p.name, "constant" if p.kind == "constant" else "tensor" if p.name in tensors
                      else "unused" if p.name == "v_reset" and not hard else "scalar") for p in self.spec.params)

    @functools.cached_property
    def tensor_names(self) -> tuple[str, ...]:
        """The op's Tensor[] tensor_params, in order."""
        return tuple(name for name, _ in self.tensors)

    @functools.cached_property
    def scalars(self) -> tuple[str, ...]:
        """The parameters passed by value, in the op's order (the spec's)."""
        return tuple(name for name, role in self.parameters if role == "scalar")

    @functools.cached_property
    def op_scalars(self) -> tuple[str, ...]:
        """The op's float[] scalars: the scalar parameters, then the channel layout's sizes (`channel_keys`)."""
        return self.scalars + self.channel_keys

    @functools.cached_property
    def learnable(self) -> tuple[str, ...]:
        """The parameters whose per-neuron gradient partials backward returns, in order."""
        return tuple(p.name for p in self.spec.params if p.learnable and p.name not in dict(self.constants))

    @functools.cached_property
    def op_inputs(self) -> tuple[str, ...]:
        """The forward kernel's inputs by name in the op's order: the step inputs, the initial states (tensors or
        numbers), the tensor parameters, the scalars."""
        return (*self.input_keys, *(f"{s}_init" for s in self.state_names), *self.tensor_names, *self.op_scalars)

    @functools.cached_property
    def reference_step(self) -> tuple[Any, Mapping[str, Any]]:
        """What the torch reference evaluates: the derived step (`spec.system.step_system`, prepared for evaluation)
        and the parameters' symbols by name."""
        from ..reference import prepare
        from ..spec.system import step_system  # derivation: the reference path only

        system = step_system(self.spec, self.reset, dict(self.constants))
        prepare(system), self.surrogate.gradient_of_x()
        return system, dict(self.spec.parsed().param_symbols)

    def kernel(self, kind: str, dtype: Any, **options: Any) -> KernelRecord:
        """The kernel for these options (the kind's flags and layout fields, as `kernels.neuron_kernel` takes
        them): from this object, else from the disk cache, else generated."""
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
        from ..kernels import neuron_kernel  # the derive and render stages: only for kernels not on disk

        return neuron_kernel(self.spec, kind, dtype, reset=self.reset, detach_reset=self.detach_reset,
                             constants=dict(self.constants), surrogate=self.surrogate,
                             tensors=[n for n, _ in self.tensors],
                             per_neuron=[n for n, kind in self.tensors if kind == PER_NEURON],
                             per_channel=[n for n, kind in self.tensors if kind == PER_CHANNEL],
                             replay_charge=self.replay_charge, **options)

    def recipe(self, kind: str, dtype: torch.dtype, flags: Flags, layout: Layout) -> Recipe:
        """The launch recipe of a kernel; `flags` are the kind's options in `KIND_OPTIONS` order, trailing ones
        left out at their defaults (every call's path: one dict lookup once built)."""
        key = (kind, dtype, flags, layout)
        found = self._recipes.get(key)
        if found is None:
            options = dict(zip(KIND_OPTIONS[kind], flags))
            kernel = self.kernel(kind, dtype, **options, **layout.options())
            found = self._recipes[key] = Recipe(kernel, dtype, self.channel_sums)
        return found

    def tuned_layout(self, kind: str, flags: Flags, names: tuple[str, ...], args: Sequence[Any],
                     like: torch.Tensor, n: int, steps: int, long: bool) -> Layout | None:
        """The layout timed fastest for shapes like this call's (its arguments: `args`, named by `names`; once per
        process, or read from the disk store); None when it does not fit this
        call's N or tensors' alignment. Shapes are grouped by powers of two of N and T: sequence lengths that
        vary from batch to batch are timed once per group, not once per length. `long`: a long loop over few
        neurons (its own candidates)."""
        group = (n.bit_length(), steps.bit_length())
        key = (kind, like.dtype, flags, group)
        found = self._tuned.get(key)
        tensors = _tensors(args)
        if found is None:
            candidates = tuning.candidates(n, like.dtype, lambda width: _aligned(tensors, width), long)
            layouts = [Layout.of(c) for c in candidates]
            text = repr((self.text, kind, str(like.dtype), flags, group))
            given = dict(zip(names, args))  # only to time the candidates: calls that find a layout build none

            def run(layout: Layout) -> None:
                self.recipe(kind, like.dtype, flags, layout).run(given, like, n, steps, "cuda")

            found = self._tuned[key] = tuning.fastest(text, like.device, layouts, run)
        return found if tuning.fits(found, n, like.dtype.itemsize, lambda width: _aligned(tensors, width)) else None

    @functools.cached_property
    def channel_keys(self) -> tuple[str, ...]:
        """The sizes a call passes by value after its scalars when a tensor parameter holds one value per
        channel (`codegen.options.CHANNEL_KEYS`), else none."""
        return CHANNEL_KEYS if any(kind == PER_CHANNEL for _, kind in self.tensors) else ()

    @functools.cached_property
    def channel_sums(self) -> frozenset[str]:
        """Backward's outputs summed per channel in the kernel: the gradients of per-channel parameters."""
        return frozenset(f"grad_{n}" for n, kind in self.tensors if kind == PER_CHANNEL)

    @functools.cached_property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spec.states)

    @functools.cached_property
    def input_keys(self) -> tuple[str, ...]:
        """The kernels' keys of the step inputs' sequences, in the spec's order (x_seq for x alone)."""
        return tuple(input_key(name) for name in self.spec.inputs)


# The options of each kernel kind that a call chooses, in the order `NeuronConfig.recipe` takes them.
KIND_OPTIONS = {"fptt": ("store_state_seq", "save_for_backward", "given_inits", "final_states"),
                "step-forward": ("store_state_seq", "save_for_backward", "given_inits", "final_states"),
                "bptt": ("grad_state_seq", "grad_finals", "given_inits", "gradients"),
                "step-backward": ("grad_state_seq", "grad_finals", "given_inits")}


def _run(config: NeuronConfig, kind: str, flags: Flags, given: Mapping[str, Any], like: torch.Tensor,
         n: int, steps: int | None, backend: str, layout: Layout | Mapping[str, Any] | None
         ) -> dict[str, torch.Tensor]:
    if layout is not None:
        return config.recipe(kind, like.dtype, flags, Layout.of(layout)).run(given, like, n, steps, backend)
    chosen = _layout(config, kind, flags, tuple(given), tuple(given.values()), like, n, steps, backend)
    return config.recipe(kind, like.dtype, flags, chosen).run(given, like, n, steps, backend)


class KernelCall:
    """One kernel of a layer (kind and options), called with its arguments as a sequence in a fixed order
    (`names`): the ops' path. What a call's shape decides (layout, recipe, binding, grid, launcher) is found once
    per (dtype, N, T, backend, device, the tensors' alignment) and kept as a `BoundLaunch`."""

    def __init__(self, config: NeuronConfig, kind: str, flags: Flags, names: tuple[str, ...]):
        self.config, self.kind, self.flags, self.names = config, kind, flags, names
        self._bound: dict[tuple, tuple[Recipe, Binding]] = {}
        self._launches: dict[tuple, BoundLaunch] = {}

    def __call__(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str,
                 final_shape: Sequence[int] | None = None) -> tuple[tuple[str, ...], list[torch.Tensor]]:
        """(output names, outputs) in parameter order, with the layout chosen for this call (`_layout`); the final
        states in `final_shape` where it is given (`Recipe.arguments`)."""
        addresses = 0  # every tensor's address ORed: its low bits are the alignment the layouts ask about
        for value in args:
            if isinstance(value, torch.Tensor):
                addresses |= value.data_ptr()
        key = (like.dtype, n, steps, backend, like.get_device(), addresses & 15)
        bound = self._launches.get(key)
        if bound is None:
            bound = self.bind(args, like, n, steps, backend, key)
        return bound.recipe.outputs, bound(args, like, final_shape)

    def bind(self, args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str,
             key: tuple | None = None) -> BoundLaunch:
        """What a call of this shape runs (kept under `key`, except while a CUDA graph is captured: a capture
        takes the fixed rules' layout where a later call would time one)."""
        layout = _layout(self.config, self.kind, self.flags, self.names, args, like, n, steps, backend)
        found = self._bound.get((like.dtype, layout))
        if found is None:
            recipe = self.config.recipe(self.kind, like.dtype, self.flags, layout)
            found = self._bound[(like.dtype, layout)] = (recipe, Binding(recipe, self.names))
        bound = BoundLaunch(*found, like, n, steps, backend)
        if key is not None and not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            if len(self._launches) >= _MAX_LAUNCHES:  # shapes that vary without end must not grow this
                self._launches.clear()
            self._launches[key] = bound
        return bound


_MAX_LAUNCHES = 256


class BoundLaunch:
    """One kernel for one call shape, device and alignment: recipe, binding, grid, block and launcher found; a
    call allocates the outputs, arranges the values and launches."""

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


def _layout(config: NeuronConfig, kind: str, flags: Flags, names: tuple[str, ...], args: Sequence[Any],
            like: torch.Tensor, n: int, steps: int | None, backend: str) -> Layout:
    """The layout of a call (`_loop_layout`); a sequence shorter than a replay segment replays one segment of T
    steps (`replay_option`), whose steps need no test against T, so their loads issue together."""
    return _for_steps(_loop_layout(config, kind, flags, names, args, like, n, steps, backend), steps)


def _for_steps(layout: Layout, steps: int | None) -> Layout:
    return _replaying(layout, steps) if steps and steps < layout.replay else layout


@functools.lru_cache(maxsize=256)
def _replaying(layout: Layout, steps: int) -> Layout:
    """`layout` replaying segments of `steps` steps, built once per pair (as `_with_access`'s)."""
    return layout.replace(replay=steps)


def _loop_layout(config: NeuronConfig, kind: str, flags: Flags, names: tuple[str, ...],
                 args: Sequence[Any], like: torch.Tensor, n: int, steps: int | None, backend: str) -> Layout:
    """The layout of a call (its arguments: `args`, named by `names`):
    time loops on a GPU take the layout timed fastest for their shape (`runtime.tuning`), other calls the fixed
    rule below, as do short loops over fewer than LONG_LOOP_NEURONS neurons: small problems, whose host time
    per call matters more than their kernels' few microseconds."""
    long = long_loop(n, steps)
    tune = long or (bool(steps) and n >= LONG_LOOP_NEURONS)
    if tune and backend == "cuda" and not torch.cuda.is_current_stream_capturing():
        tuned = config.tuned_layout(kind, flags, names, args, like, n, steps or 0, long)
        if tuned is not None:
            return tuned
    small = small_layout(n, steps)
    if small is not None:
        return small
    # outputs come from torch's allocator, whose blocks are aligned far beyond 16 bytes
    widths = (max(4, LONG_LOOP_LANES * like.dtype.itemsize),) if long else VECTOR_BYTES
    access = choose_layout(n, like.dtype, _tensors(args), widths)
    return _with_access(LONG_LOOP if long else SHORT_LOOP, access)


@functools.lru_cache(maxsize=64)
def _with_access(loop: Layout, access: Layout) -> Layout:
    return loop.replace(lanes=access.lanes, vector=access.vector)


def small_layout(n: int, steps: int | None) -> Layout | None:
    """The fixed rule's layout of a call over too few neurons for two per thread (no alignment to check), or None
    for more neurons (`_layout`; a GPU may time a long loop's layout instead)."""
    if n >= 2 * MIN_THREADS:
        return None
    return LONG_LOOP if long_loop(n, steps) else SMALL_LOOP


def fixed_layout(n: int, steps: int | None) -> Layout | None:
    """`_layout`'s answer for a call over too few neurons for two per thread (`small_layout`, replaying one segment
    of T steps where T is shorter than a segment), or None for more neurons: for callers that compile a call's
    kernels before it runs (`testing.check_spec`, the tests)."""
    small = small_layout(n, steps)
    return None if small is None else _for_steps(small, steps)


def long_loop(n: Any, steps: Any) -> bool:
    """Whether a multi-step kernel over N neurons and T steps runs a long loop over few neurons (`LONG_LOOP`)."""
    return bool(steps) and steps >= LONG_LOOP_STEPS and n < LONG_LOOP_NEURONS


def replay_option(n: Any, steps: Any) -> dict[str, int]:
    """The `replay` option that a call of such a shape runs with (none: the kernels' default), for callers that must
    know the shape of `<state>_checkpoints` without choosing a layout (fake kernels, tests): `_layout`'s, or T
    where T is shorter than a segment (`KernelCall`: one segment of T steps, whose steps need no test against T)."""
    if long_loop(n, steps):
        return {"replay": tuning.REPLAY}
    return {"replay": int(steps)} if steps and steps < REPLAY_STEPS else {}


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    return [t for t in values if isinstance(t, torch.Tensor) and t.dim()]


def _aligned(tensors: list[torch.Tensor], width: int) -> bool:
    return all(t.data_ptr() % width == 0 for t in tensors)


def given_inits(initial: Mapping[str, torch.Tensor | float]) -> bool:
    """True for initial states given as tensors ([N] each), False for one number each (for all neurons)."""
    numbers = [not isinstance(v, torch.Tensor) for v in initial.values()]
    if any(numbers) and not all(numbers):
        raise TypeError("initial states: give every state as a tensor or every state as a number, not a mix")
    return not numbers or not numbers[0]


def forward(config: NeuronConfig, x: torch.Tensor | Sequence[torch.Tensor], initial: Mapping[str, torch.Tensor | float],
            params: Mapping[str, Any], *, single_step: bool = False, store_state_seq: bool = False,
            save_for_backward: bool = True, final_states: bool = True, backend: str = "cuda",
            layout: Layout | Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Launch the forward kernel: returns spike_seq, h_seq / <state>_seq as configured, and <state>_final
    (unless `final_states` is False), in the kernel's parameter order. `x`: the input, or a sequence of one
    tensor per step input for a spec with several (all of one shape). `initial`: every state's [N] tensor, or
    every state's one number. `layout` (a Layout, or some of its fields by name) overrides the fixed rules."""
    inputs = (x,) if isinstance(x, torch.Tensor) else tuple(x)
    if len(inputs) != len(config.input_keys) or any(u.shape != inputs[0].shape for u in inputs):
        raise KernelArgumentError(f"{config.spec.name}: expected {len(config.input_keys)} input tensor(s) of one "
                                  f"shape ({', '.join(config.spec.inputs)}), got shapes "
                                  f"{[tuple(u.shape) for u in inputs]}")
    x = inputs[0]
    given = {**dict(zip(config.input_keys, inputs)), **{f"{s}_init": v for s, v in initial.items()}, **params}
    kind = "step-forward" if single_step else "fptt"
    flags = (store_state_seq, save_for_backward, given_inits(initial), final_states)
    return _run(config, kind, flags, given, x, x.shape[-1], None if single_step else x.shape[0], backend, layout)


def backward(config: NeuronConfig, grads: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
             params: Mapping[str, Any], *, single_step: bool = False, grad_state_seq: bool = False,
             grad_finals: bool = True, given_inits: bool = True, backend: str = "cuda",
             layout: Layout | Mapping[str, Any] | None = None, gradients: str = "all") -> dict[str, torch.Tensor]:
    """Launch the backward kernel. `grads`: grad_spike_seq, grad_<state>_final (unless `grad_finals` is False:
    they are zero) and grad_<state>_seq (when `grad_state_seq`);
    `saved`: h_seq and whatever else the kernel reads (x_seq or each input's sequence, <state>_seq,
    <state>_init: tensors, or numbers when `given_inits` is False). Returns grad_x_seq (grad_<input>_seq for
    each of several inputs), grad_<state>_init (for tensors given) and grad_<param>
    (per-neuron partial sums; reduce them). `gradients` (BPTT): what it stores (`kernels.neuron_kernel`); the
    correction's c1 and c0 come in `params` under their keys."""
    grad_spike = grads["grad_spike_seq"]
    kind = "step-backward" if single_step else "bptt"
    flags = (grad_state_seq, grad_finals, given_inits) + (() if gradients == "all" else (gradients,))
    return _run(config, kind, flags, {**grads, **saved, **params},
                grad_spike, grad_spike.shape[-1], None if single_step else grad_spike.shape[0], backend, layout)
