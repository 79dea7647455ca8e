"""The thread layout of a time loop, chosen by timing candidates on the GPU once per shape.

Many steps over few neurons (T >= 64, N < 128K) leave each thread a long loop whose speed depends on memory
latency, and which layout runs fastest (neurons per thread, inputs loaded steps ahead) differs between models,
dtypes and directions by up to 4x in the kernel sweeps on an H200
(`bench/results/2026-11-22-h200-warm-start/long_layout_sweep.txt`, `prefetch_sweep.txt`): Izhikevich's float32
backward at (1024, 16K) took 0.51 ms without prefetching and 0.22 ms with it, LIF's 0.26 and 0.48 ms (before
prefetching went through shared memory). Loops over many neurons (N >= 128K) differ less, but still by model:
ParametricLIF's float32 backward at (8, 8M) took 0.221 ms with two neurons per thread and 0.208 ms with four,
while LIF's was 0.193 and 0.194 ms, and at (64, 1M) 0.201 and 0.212 ms
(`bench/results/2026-11-23-h200-half-arithmetic/sweep_f32.txt`). Every layout gives bitwise the same results
(tests/test_layouts.py, and a GPU test per candidate), so the first call of a shape times each candidate a few
times and keeps the fastest for shapes of its size (N and T to the next power of two), in memory and in the
disk store (per GPU model). Nothing is timed while a CUDA graph is being captured: the fixed rule of
`runtime.neuron` serves there.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any

import torch

from .. import store

REPEATS = 5
# (neurons per thread, steps of inputs copied ahead into shared memory, threads per block, steps per block of
# inputs loaded a block ahead into registers) tried for each long loop; every candidate is unrolled. Small blocks
# leave room for a deep ring: in the micro-benchmark of `bench/results/2026-11-22-h200-async-ring` (LIF forward,
# (1024, 16K)) 32 steps ahead with 64 or 128 threads per block took 0.062 ms, 16 steps with 256 threads 0.082 ms,
# none (unrolled) 0.153 ms. Registers served half precision and backward better still on an H100
# (`codegen.neuron.staged_steps`).
CANDIDATES = ((1, 0, 256, 0), (2, 0, 256, 0), (4, 0, 256, 0), (1, 32, 64, 0), (2, 32, 64, 0),
              (1, 0, 64, 32), (2, 0, 64, 16), (2, 0, 64, 32))
UNROLL = 8
REPLAY = 32  # steps per checkpoint of replayed states (`runtime.neuron.LONG_LOOP` says why)
# Loops over many neurons: bytes each thread moves per access (one 4-byte word, 8- or 16-byte vectors), unrolled
# twice (the fixed rule, `runtime.neuron.SHORT_LOOP`) or four times, 256 threads per block, nothing copied ahead.
# Four times pays where a step has much arithmetic: TwoCompartment's bfloat16 inference at (64, 1M) reached
# 85.4% of the floor with it, 81.7% unrolled twice (H200, `bench/results/2026-11-23-h200-short-unroll`).
SHORT_WIDTHS, SHORT_UNROLL, SHORT_UNROLLS = (4, 8, 16), 2, (2, 4)


def candidates(n: int, dtype: torch.dtype, aligned: Callable[[int], bool], long: bool = True
               ) -> list[dict[str, Any]]:
    """The layouts to try for N neurons: for long loops, per-thread neuron counts this dtype and N allow, with
    and without prefetching (a kernel that cannot prefetch its elements asynchronously runs without:
    `codegen.neuron.pipeline_depth`). Half precision moves neurons in pairs (one 4-byte word), so one neuron
    per thread is two, except with prefetching, whose ring copies the pair holding a thread's one neuron.
    For other loops (`long=False`), the access widths of `SHORT_WIDTHS` that N and the alignment allow, each
    unrolled as `SHORT_UNROLLS` says."""
    if not long:
        return _short_candidates(n, dtype.itemsize, aligned)
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


def fits(layout: dict[str, Any], n: int, itemsize: int, aligned: Callable[[int], bool]) -> bool:
    """Whether `layout` serves N neurons whose tensors pass `aligned(width)`: vector accesses and pair copies
    move several elements at once, so N must be a multiple of them and the tensors aligned to their width."""
    lanes = layout["lanes"]
    if _pair_copies(lanes, layout.get("prefetch", 0), itemsize):
        multiple, width = 2, 4
    elif layout["vector"]:
        multiple, width = lanes, lanes * itemsize
    else:
        return True
    return width <= 16 and n % multiple == 0 and aligned(width)


def _pair_copies(lanes: int, prefetch: int, itemsize: int) -> bool:
    """The ring copies, for one 2-byte neuron per thread, the 4-byte pair holding it (`codegen.neuron.pair_copies`)."""
    return bool(prefetch) and lanes == 1 and itemsize == 2


def _elapsed_ms(run: Callable[[], Any], flush: torch.Tensor | None = None) -> float:
    """The median of REPEATS runs, each timed alone after `flush` (a buffer the size of the L2 cache) is
    written: in a network a layer's kernels follow other layers' kernels, never their own, and timed back to back
    the candidates ranked differently. At (64, 1M) float32 inference on an H200, 8-byte accesses beat 16-byte
    ones by 0.5-1.7% back to back, and lost to them by 2.5-2.7% after the flush, as in the benchmark (which
    writes 256 MiB before each call; `bench/results/2026-11-23-h200-tuner-flush`)."""
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


def stored_layout(data: bytes | None, layouts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate of `layouts` that a tuning entry names, or None (time again) when the entry is missing or is
    anything but one of them: small, JSON, an object equal to a candidate (whose own object is returned)."""
    if data is None or len(data) > MAX_ENTRY_BYTES:
        return None
    try:
        layout = json.loads(data)
    except (ValueError, RecursionError):  # not JSON; nested deeper than the parser goes
        return None
    return next((candidate for candidate in layouts if isinstance(layout, dict) and layout == candidate), None)


def fastest(text: str, device: torch.device, layouts: list[dict[str, Any]],
            run: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
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
    times = [_elapsed_ms(lambda layout=layout: run(layout), flush) for layout in layouts]
    best = layouts[times.index(min(times))]
    store.save("tuning", name, json.dumps(best).encode())
    return best
