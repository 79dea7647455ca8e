"""Layers whose output is not the spike (STBIF's s q_threshold, LIAF's analog output, a non-spiking neuron's
membrane) run a multi-step call that takes no gradient on kernels that write the output in place of the spike (the
spec's `writes_output` variant: `nn.layer_call.writes_output`), not the spike and then the output in torch: on the
host runner, the same outputs and final states as the reference layers; a call that takes a gradient keeps the
spike and torch's output; the variant has no backward kernel; the pinned kernels are unchanged (test_golden)."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from conftest import compile_launched

from autocuda.codegen.kernels import neuron_kernel
from autocuda.nn import LIAFNode, Neuron, STBIFNode
from autocuda.spec.load import load_spec

F64 = torch.float64
LAYERS = {"STBIFNode": lambda backend: STBIFNode(0.25, 8, sym=True, step_mode="m", backend=backend),
          "LIAFNode": lambda backend: LIAFNode(torch.nn.Tanh(), threshold_related=True, step_mode="m",
                                               backend=backend),
          "Neuron(nonspiking_lif)": lambda backend: Neuron("nonspiking_lif", step_mode="m", backend=backend),
          "Neuron(liaf)": lambda backend: Neuron("liaf", step_mode="m", backend=backend)}


DTYPES = (torch.float64, torch.float32)


def inputs(dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(6, 2, 33, generator=torch.Generator().manual_seed(0), dtype=F64) * 0.8 + 0.3).to(dtype)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the cases below, compiled up front many to a compiler run (`conftest.compile_launched`)."""
    def calls(name: str, dtype: torch.dtype) -> None:
        with torch.no_grad():
            LAYERS[name]("host").to(dtype)(inputs(dtype))

    return compile_launched(*(functools.partial(calls, name, dtype) for name in LAYERS for dtype in DTYPES))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_an_inference_call_writes_the_output_in_the_kernel(name: str, dtype: torch.dtype) -> None:
    x = inputs(dtype)
    results = []
    for backend in ("host", "torch"):
        layer = LAYERS[name](backend).to(dtype)
        with torch.no_grad():
            out = layer(x)
        results.append((out, *(getattr(layer, s) for s in layer._state_names)))
        assert ("_written_spec" in layer.__dict__) == (backend == "host")
    for ours, theirs in zip(*results):
        assert ours.dtype == theirs.dtype == dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-12 if dtype == F64 else 1e-6, atol=1e-12)


def test_a_call_that_takes_a_gradient_keeps_the_spike_and_torchs_output() -> None:
    layer = Neuron("liaf", step_mode="m", backend="host").double()
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    out = layer(x)
    assert "_written_spec" not in layer.__dict__ and out.requires_grad


def test_the_variant_has_no_backward() -> None:
    spec = dataclasses.replace(load_spec("liaf"), writes_output=True)
    assert neuron_kernel(spec, "fptt", save_for_backward=False).full_codes != neuron_kernel(
        load_spec("liaf"), "fptt", save_for_backward=False).full_codes
    for kernel, options in (("bptt", {}), ("fptt", {"save_for_backward": True})):
        with pytest.raises(ValueError, match="no backward"):
            assert not neuron_kernel(spec, kernel, **options).full_codes
