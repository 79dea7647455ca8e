"""Layers and the host runner across threads and processes (CPU): a layer pickled in one process runs in another
(what it keeps of this process's registry, spec references, is worked out again there), a reference that names
nothing in this process says so, a forked child never waits on a lock that a thread of its parent held at the
fork (the child has no such thread), and threads calling layers of one configuration at once get what one thread
gets."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import textwrap
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import python_children
import torch

from autocuda import nn as ann
from autocuda.base.errors import SpecError
from autocuda.codegen.ckernel import CParam
from autocuda.runtime.configs import resolve_spec, spec_ref
from autocuda.toolchain.host import cxx as toolchain
from autocuda.toolchain.host import runner

REPO = Path(__file__).resolve().parents[1]
HOST_MISSING = toolchain.missing()
needs_host = pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")

# A fresh process (a forked child of a server that imported torch only): unpickles the layer, runs it on x, and
# exits 0 where its output is the one expected.
UNPICKLE_AND_RUN = textwrap.dedent("""
    import pickle, sys
    import torch
    with open(sys.argv[1], "rb") as file:
        layer = pickle.load(file)
    x, expected = torch.load(sys.argv[2])
    with torch.no_grad():
        out = layer(x)
    assert torch.equal(out, expected), (out - expected).abs().max()
""")


@needs_host
def test_a_layer_whose_kernels_wrote_its_output_runs_after_unpickling_in_a_fresh_process(tmp_path):
    """A non-spiking layer's inference call runs the output-writing variant of its spec, whose reference the layer
    keeps; a copy unpickled in another process (a spawned DataLoader worker, torch.load in a new session) must work it
    out again there, not use this process's token."""
    layer = ann.Neuron("nonspiking_lif", step_mode="m", backend="host").double()
    torch.manual_seed(0)
    x1, x2 = (torch.randn(4, 3, 5, dtype=torch.float64) * 2 for _ in range(2))
    with torch.no_grad():
        layer(x1)  # mid-sequence: the states and the variant's reference are held
    (tmp_path / "layer.pkl").write_bytes(pickle.dumps(layer))
    with torch.no_grad():
        expected = layer(x2)
    torch.save((x2, expected), tmp_path / "x.pt")
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = python_children.run(["-c", UNPICKLE_AND_RUN, str(tmp_path / "layer.pkl"), str(tmp_path / "x.pt")],
                               env=env, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["spec", "surrogate"])
def test_a_reference_registered_in_another_process_is_refused_as_such(kind):
    token = f"<{kind} lif {uuid.uuid4().hex[:16]}>"  # what `spec_ref` makes, never registered here
    with pytest.raises(SpecError, match="registered in another process"):
        if kind == "spec":
            resolve_spec(token)
        else:
            from autocuda.runtime.configs import config_for
            config_for(spec_ref("lif"), token, None, False, (), (), True)


def _kernel() -> tuple[str, str, tuple[CParam, ...]]:
    """A kernel no cache holds yet (its name is new): loading it compiles it."""
    name = f"fork_probe_{uuid.uuid4().hex[:12]}"
    source = (f'extern "C" __global__ void {name}(const double* x, double* y, const long long n) {{\n'
              "    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
              "    if (i < n) y[i] = 3.0 * x[i];\n}\n")
    return source, name, (CParam("x", "double", True, True), CParam("y", "double", True, False),
                          CParam("n", "long long", False, True))


def _launch_in_child(source: str, name: str, params: tuple[CParam, ...], original) -> None:
    runner._compile = original  # the child compiles for itself (the parent's thread is not in it)
    x = np.arange(7.0)
    y = np.empty_like(x)
    runner.launch(source, name, params, (1,), (32,), [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data),
                                                      np.int64(x.size)])
    os._exit(0 if np.array_equal(y, 3 * x) else 1)


@needs_host
@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork on this platform")
def test_a_forked_child_loads_a_kernel_that_a_thread_of_its_parent_was_compiling_at_the_fork(tmp_path,
                                                                                            monkeypatch):
    """The parent's thread holds the kernel's loading lock while it compiles; the child, which has no such thread,
    loads the kernel itself instead of waiting for ever."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    source, name, params = _kernel()
    inside, forked = threading.Event(), threading.Event()
    original = runner._compile

    def compiling(*args, **kwargs):
        inside.set()
        forked.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "_compile", compiling)
    thread = threading.Thread(target=runner.load_kernel, args=(source, name, params))
    thread.start()
    try:
        assert inside.wait(60)
        child = multiprocessing.get_context("fork").Process(target=_launch_in_child,
                                                            args=(source, name, params, original))
        child.start()
    finally:
        forked.set()
        thread.join(60)
    child.join(30)
    if child.exitcode is None:
        child.kill()
        child.join()
        pytest.fail("the forked child hung on a lock its parent's thread held at the fork")
    assert child.exitcode == 0


@needs_host
def test_threads_calling_layers_of_one_configuration_at_once_get_the_single_threaded_results():
    torch.manual_seed(0)
    xs = [torch.randn(5, 2, 9, dtype=torch.float64) * 2 for _ in range(4)]

    def session(x: torch.Tensor) -> list[torch.Tensor]:
        layer = ann.ParametricLIFNode(step_mode="m", backend="host").double()
        out = []
        for _ in range(3):
            given = x.clone().requires_grad_(True)
            spikes = layer(given)
            out += [spikes.detach(), *torch.autograd.grad(spikes.sum(), [given, layer.w])]
            layer.detach()
        return out

    alone = [session(x) for x in xs]
    start = threading.Barrier(len(xs))

    def together(x: torch.Tensor) -> list[torch.Tensor]:
        start.wait(60)
        return session(x)

    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(together, xs, timeout=120))
    for got, expected in zip(results, alone):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
