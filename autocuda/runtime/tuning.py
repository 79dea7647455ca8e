"""The layout of a call: the fixed rules (`fixed_rule`), or for a long time loop on the GPU, candidates timed once
per shape.

Which layout runs fastest (neurons per thread, inputs loaded steps ahead) differs between models, dtypes and
directions, while every layout gives bitwise the same results. So the first call of a shape times each candidate
a few times and keeps the fastest for shapes of its size (N and T to the next power of two), in memory and in
the disk store (per GPU model). Nothing is timed while a CUDA graph is being captured: the fixed rules serve
there, as for calls that are not timed (`timed`). Candidates are the generator's keyword options
(`kernels.neuron_kernel`); `Layout.of` reads one as a `Layout`.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..base.progress import progress
from ..codegen.layout import REPLAY_STEPS, Layout
from ..toolchain import store

Options = Mapping[str, Any]  # some of a Layout's fields by name: the generator's keyword options

REPEATS = 5
# Long loops: (neurons per thread, steps of inputs copied ahead into shared memory, threads per block, steps per
# block of inputs loaded a block ahead into registers); every candidate is unrolled UNROLL times.
CANDIDATES = ((1, 0, 256, 0), (2, 0, 256, 0), (4, 0, 256, 0), (1, 32, 64, 0), (2, 32, 64, 0),
              (1, 0, 64, 32), (2, 0, 64, 16), (2, 0, 64, 32))
UNROLL = 8
REPLAY = 32  # steps per checkpoint of replayed states in long loops
# Loops over many neurons: bytes each thread moves per access (one 4-byte word, 8- or 16-byte vectors), unrolled
# twice (the fixed rule, `SHORT_LOOP`) or four times, 256 threads per block.
SHORT_WIDTHS, SHORT_UNROLL, SHORT_UNROLLS = (4, 8, 16), 2, (2, 4)
# Kernels that draw random numbers are bound by their arithmetic more than by memory: their short loops also try
# each of those layouts with 64 threads a block.
DRAWING_BLOCK = 64

# -- the fixed rules: the layout of a call that is not timed ----------------------------------------------------
VECTOR_BYTES = (8, 16, 4)       # preferred aligned access widths, in order
MIN_THREADS = 4096              # below this many threads, keep one word per thread: latency needs parallelism
# Many steps over few neurons: unrolled eight times, replayed states in 32-step segments, 16 steps of inputs
# staged in registers a block ahead, 64 threads per block (so that 16K neurons still spread over the SMs).
LONG_LOOP = Layout(block=64, replay=REPLAY, staged=16, unroll=UNROLL)
LONG_LOOP_STEPS, LONG_LOOP_NEURONS = 64, 128 * 1024
LONG_LOOP_LANES = 2             # neurons per thread there, in one vector access (staged inputs need one)
# Other loops over many neurons unroll twice: the loads of the next step issue before this step's arithmetic.
SHORT_LOOP = Layout(unroll=SHORT_UNROLL)
# Short loops over too few neurons for two per thread unroll four times: four steps' loads issue at once.
SMALL_LOOP = Layout(unroll=4)


def timed(n: int, steps: int | None) -> bool:
    """Whether a GPU times the layout of a call (`fastest`): long loops over few neurons, and any time loop over
    LONG_LOOP_NEURONS or more; smaller problems, whose host time per call matters more than their kernels' few
    microseconds, take the fixed rules."""
    return long_loop(n, steps) or (bool(steps) and n >= LONG_LOOP_NEURONS)


def fixed_rule(n: int, steps: int | None, dtype: torch.dtype, tensors: list[torch.Tensor]) -> Layout:
    """The fixed rules' layout of a call over N neurons and T steps whose tensors are `tensors` (outputs come
    from torch's allocator, whose blocks are aligned far beyond 16 bytes)."""
    fixed = fixed_layout(n, steps)
    if fixed is not None:
        return fixed
    long = long_loop(n, steps)
    widths = (max(4, LONG_LOOP_LANES * dtype.itemsize),) if long else VECTOR_BYTES
    return for_steps(_with_access(LONG_LOOP if long else SHORT_LOOP, choose_layout(n, dtype, tensors, widths)), steps)


def fixed_layout(n: int, steps: int | None) -> Layout | None:
    """The fixed rules' layout of a call over too few neurons for two per thread (no alignment to check), or None
    for more neurons: also for callers that compile a call's kernels before it runs (`testing.check_spec`)."""
    if n >= 2 * MIN_THREADS:
        return None
    return for_steps(LONG_LOOP if long_loop(n, steps) else SMALL_LOOP, steps)


def choose_layout(n: int, dtype: torch.dtype, tensors: list[torch.Tensor],
                  widths: tuple[int, ...] = VECTOR_BYTES) -> Layout:
    """Neurons per thread and vector access for N neurons: the first of `widths` (bytes per access) that keeps
    enough threads. Odd sizes or unaligned tensors fall back to per-lane accesses (correct for any N)."""
    for width in widths:
        lanes = width // dtype.itemsize
        if lanes >= 2 and n % lanes == 0 and n // lanes >= MIN_THREADS and aligned(tensors, width):
            return _vector_layout(lanes)
    return _SCALAR_LAYOUT


# choose_layout's answers, built once: a Layout per call would cost more host time than the rest of the choice
_SCALAR_LAYOUT = Layout()


@functools.lru_cache(maxsize=16)
def _vector_layout(lanes: int) -> Layout:
    return Layout(lanes=lanes, vector=True)


@functools.lru_cache(maxsize=64)
def _with_access(loop: Layout, access: Layout) -> Layout:
    return loop.replace(lanes=access.lanes, vector=access.vector)


def for_steps(layout: Layout, steps: int | None) -> Layout:
    """`layout`, where a sequence is shorter than its replay segment replaying one segment of T steps
    (`replay_option`), whose steps need no test against T, so their loads issue together."""
    return _replaying(layout, steps) if steps and steps < layout.replay else layout


@functools.lru_cache(maxsize=256)
def _replaying(layout: Layout, steps: int) -> Layout:
    return layout.replace(replay=steps)  # built once per pair, as `_with_access`'s


def long_loop(n: Any, steps: Any) -> bool:
    """Whether a multi-step kernel over N neurons and T steps runs a long loop over few neurons (`LONG_LOOP`)."""
    return bool(steps) and steps >= LONG_LOOP_STEPS and n < LONG_LOOP_NEURONS


def replay_option(n: Any, steps: Any) -> dict[str, int]:
    """The `replay` option that a call of such a shape runs with (none: the kernels' default), for callers that must
    know the shape of `<state>_checkpoints` without choosing a layout (fake kernels, tests): `fixed_rule`'s, or T
    where T is shorter than a segment (`for_steps`)."""
    if long_loop(n, steps):
        return {"replay": REPLAY}
    return {"replay": int(steps)} if steps and steps < REPLAY_STEPS else {}


def aligned(tensors: list[torch.Tensor], width: int) -> bool:
    return all(t.data_ptr() % width == 0 for t in tensors)


def candidates(n: int, dtype: torch.dtype, aligned: Callable[[int], bool], long: bool = True,
               draws: bool = False) -> list[dict[str, Any]]:
    """The layouts to try for N neurons: for long loops, per-thread neuron counts this dtype and N allow, with
    and without prefetching (a kernel that cannot prefetch its elements asynchronously runs without:
    `codegen.neuron_kernel.pipeline_depth`). Half precision moves neurons in pairs (one 4-byte word), so one neuron
    per thread is two, except with prefetching, whose ring copies the pair holding a thread's one neuron.
    For other loops (`long=False`), the access widths of `SHORT_WIDTHS` that N and the alignment allow, each
    unrolled as `SHORT_UNROLLS` says, and for a kernel that `draws` each also with `DRAWING_BLOCK` threads a
    block."""
    if not long:
        short = _short_candidates(n, dtype.itemsize, aligned)
        return short + [{**layout, "block": DRAWING_BLOCK} for layout in short] if draws else short
    out = []
    for lanes, prefetch, block, staged in CANDIDATES:
        pairs = _pair_copies(lanes, prefetch, dtype.itemsize)
        if not pairs:
            lanes = max(lanes, 4 // dtype.itemsize)  # a 4-byte word at least
        vector = lanes > 1 or bool(staged)  # staged inputs sit in registers as vectors (one word at least)
        layout = {"lanes": lanes if vector or pairs else 0, "vector": vector, "unroll": UNROLL,
                  "prefetch": prefetch, "block": block, "replay": REPLAY, **({"staged": staged} if staged else {})}
        if fits(layout, n, dtype.itemsize, aligned) and layout not in out:
            out.append(layout)
    # Half precision with odd N fits none of them: one word per thread, element by element, still does.
    return out or [{"lanes": 0, "vector": False, "unroll": UNROLL, "prefetch": 0, "block": 256, "replay": REPLAY}]


def _short_candidates(n: int, itemsize: int, aligned: Callable[[int], bool]) -> list[dict[str, Any]]:
    out = []
    for width in SHORT_WIDTHS:
        lanes = width // itemsize
        for unroll in SHORT_UNROLLS:
            layout = {"lanes": lanes if lanes > 1 else 0, "vector": lanes > 1, "unroll": unroll}
            if lanes and fits(layout, n, itemsize, aligned) and layout not in out:
                out.append(layout)
    return out or [{"lanes": 0, "vector": False, "unroll": SHORT_UNROLL}]  # odd N in half precision


def fits(options: Layout | Options, n: int, itemsize: int, aligned: Callable[[int], bool]) -> bool:
    """Whether a layout serves N neurons whose tensors pass `aligned(width)`: vector accesses and pair copies
    move several elements at once, so N must be a multiple of them and the tensors aligned to their width."""
    layout = Layout.of(options)
    lanes = layout.lanes
    if _pair_copies(lanes, layout.prefetch, itemsize):
        multiple, width = 2, 4
    elif layout.vector:
        multiple, width = lanes, lanes * itemsize
    else:
        return True
    return width <= 16 and n % multiple == 0 and aligned(width)


def _pair_copies(lanes: int, prefetch: int, itemsize: int) -> bool:
    """The ring copies, for one 2-byte neuron per thread, the 4-byte pair holding it
    (`codegen.neuron_kernel.pair_copies`)."""
    return bool(prefetch) and lanes == 1 and itemsize == 2


def _elapsed_ms(run: Callable[[], Any], flush: torch.Tensor | None = None) -> float:
    """The median of REPEATS runs, each timed alone after `flush` (a buffer the size of the L2 cache) is
    written: in a network a layer's kernels follow other layers' kernels, never their own, and timed back to back
    the candidates ranked differently than after a flush."""
    run()  # loads the kernel (compiles it the first time) and warms up
    # The device waits while the host queues the run, so the events time the kernel rather than the host's
    # launch (which takes longer than a short kernel).
    sleep = getattr(torch.cuda, "_sleep", None)  # private in torch: without it, timings include some host time
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush is not None:
            flush.zero_()
        if sleep is not None:
            sleep(1_000_000)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    import statistics  # with fractions and decimal: only a process that times layouts imports them

    return statistics.median(times)


def _l2_flush(device: torch.device) -> torch.Tensor | None:
    """A buffer as large as the device's L2 cache (None where its size is unknown or memory is short: the runs
    are then timed without)."""
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    if not size:
        return None
    try:
        return torch.empty(size // 4, dtype=torch.int32, device=device)
    except torch.cuda.OutOfMemoryError:
        return None


MAX_ENTRY_BYTES = 4096  # a stored layout is one small JSON object


def _fields(layout: Layout | Options) -> dict[str, Any]:
    return layout.options() if isinstance(layout, Layout) else dict(layout)


def stored_layout(data: bytes | None, layouts: list[Any]) -> Any | None:
    """The candidate of `layouts` that a tuning entry names, or None (time again) when the entry is missing or is
    anything but one of them: small, JSON, an object equal to a candidate (whose own object is returned)."""
    if data is None or len(data) > MAX_ENTRY_BYTES:
        return None
    try:
        layout = json.loads(data)
    except (ValueError, RecursionError):  # not JSON; nested deeper than the parser goes
        return None
    return next((candidate for candidate in layouts if isinstance(layout, dict) and layout == _fields(candidate)), None)


def fastest(text: str, device: torch.device, layouts: list[Layout], run: Callable[[Layout], Any]) -> Layout:
    """The fastest of `layouts` for the kernel call that `text` names: from the disk store, else timed
    (`run(layout)` launches the kernel with one) and stored."""
    if len(layouts) == 1:
        return layouts[0]
    # the candidates belong to the key: a new set of them is timed afresh rather than one of the old ones reused
    name = store.key(repr(("layout", text, torch.cuda.get_device_name(device), layouts)))
    known = stored_layout(store.read("tuning", name), layouts)
    if known is not None:
        return known
    flush = _l2_flush(device)
    times = [_elapsed_ms(functools.partial(run, layout), flush)
             for layout in progress(layouts, desc="tuning a long loop's layout", leave=False)]
    best = layouts[times.index(min(times))]
    store.save("tuning", name, json.dumps(_fields(best)).encode())
    return best
