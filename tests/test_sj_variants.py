"""SpikingJelly's non-spiking, analog-output and complementary neurons (autocuda.nn.spikingjelly_variants), in
float64 on the CPU against SpikingJelly's own classes, on the reference and on the generated kernels (host
runner): equal outputs and spikes, states and gradients within rounding (skipped where SpikingJelly does not
import)."""
from __future__ import annotations

import functools
import inspect

import pytest
import torch
from backends import CPU_BACKENDS
from conftest import compile_launched

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.nn import Neuron
from autocuda.toolchain.host import cxx as toolchain

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import neuron as sj_neuron
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
BACKENDS = CPU_BACKENDS
NON_SPIKING = [("NonSpikingIFNode", {}), ("NonSpikingLIFNode", {"tau": 3.0})]
DECODES = [None, "max-mem", "max-abs-mem", "mean-mem", "last_mem"]
LIAF = [{}, {"v_reset": None, "decay_input": False, "tau": 3.0}, {"detach_reset": True, "v_threshold": 0.5}]
COMPLEMENTARY = [{}, {"tau": 3.0, "v_threshold": 0.6, "surrogate_function": ours.ATan()}]


def inputs(seed: int, shape: tuple[int, ...] = (6, 3, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = 1.5 * torch.randn(*shape, dtype=F64)
    return x.clone().requires_grad_(True), x.clone().requires_grad_(True)


def weighted_sum(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum()


def run(layer: torch.nn.Module, x_seq: torch.Tensor, step_mode: str) -> torch.Tensor:
    return layer(x_seq) if step_mode == "m" else torch.stack([layer(x) for x in x_seq])


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the tests below, compiled up front many to a compiler run (`conftest.compile_launched`):
    each test would compile its own in a compiler run of their own. Each layer is called twice (the second call
    starts from the states the first kept), then backward, as in the tests."""
    if toolchain.missing() is not None:
        return 0

    def calls(make, step_mode: str) -> None:
        layer, (_, y) = make(), inputs(0)
        for _ in range(2):
            out = layer(y) if step_mode == "" else run(layer, y, step_mode)
        weighted_sum(torch.stack(out) if isinstance(out, list) else out).backward()

    makers = [(functools.partial(getattr(our, name), decode=decode, backend="host", **kwargs), "")
              for name, kwargs in NON_SPIKING for decode in DECODES]
    for step_mode in ("s", "m"):
        makers += [(functools.partial(our.LIAFNode, torch.nn.ReLU(), related, step_mode=step_mode, backend="host",
                                      **kwargs), step_mode) for kwargs in LIAF for related in (True, False)]
        makers += [(functools.partial(our.ComplementaryLIFNode, step_mode=step_mode, store_state_seqs=True,
                                      backend="host", **kwargs), step_mode) for kwargs in COMPLEMENTARY]
    return compile_launched(*(functools.partial(calls, make, step_mode) for make, step_mode in makers))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize(("name", "kwargs"), NON_SPIKING)
def test_non_spiking_nodes_as_theirs(name: str, kwargs: dict, decode: str | None, backend: str) -> None:
    theirs, mine = getattr(sj_neuron, name)(decode=decode, **kwargs), getattr(our, name)(decode=decode,
                                                                                         backend=backend, **kwargs)
    x, y = inputs(1)
    for _ in range(2):  # every call starts from v = 0, as theirs
        a, b = theirs(x), mine(y)
    if decode is None:  # a list of the steps' membranes, as theirs
        assert isinstance(b, list) and len(b) == len(a)
        a, b = torch.stack(a), torch.stack(b)
    torch.testing.assert_close(b, a, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(mine.v, theirs.v, rtol=1e-13, atol=1e-13)
    weighted_sum(a).backward(), weighted_sum(b).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)


def test_a_non_spiking_spec_steps_as_it_runs_a_sequence() -> None:
    x = torch.randn(5, 2, 3, dtype=F64)
    single, multi = Neuron("nonspiking_lif", step_mode="s", tau=3.0), Neuron("nonspiking_lif", step_mode="m", tau=3.0)
    torch.testing.assert_close(run(single, x, "s"), multi(x))
    torch.testing.assert_close(multi(x)[-1], multi.v)  # the output is the membrane


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("threshold_related", [True, False])
@pytest.mark.parametrize("kwargs", LIAF)
def test_liaf_as_theirs(kwargs: dict, threshold_related: bool, step_mode: str, backend: str) -> None:
    # SpikingJelly 2.0's LIAFNode in step mode 'm' returns LIFNode's spikes (its multi-step path is LIFNode's,
    # which never calls `act`): ours gives the analog output in both modes, checked against theirs in 's'
    theirs = sj_neuron.LIAFNode(torch.nn.ReLU(), threshold_related, step_mode="s", **kwargs).to(F64)
    mine = our.LIAFNode(torch.nn.ReLU(), threshold_related, step_mode=step_mode, backend=backend, **kwargs)
    x, y = inputs(2)
    for _ in range(2):  # two calls: the states carry over
        a, b = run(theirs, x, "s"), run(mine, y, step_mode)
        torch.testing.assert_close(b, a, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(mine.v, theirs.v, rtol=1e-13, atol=1e-13)
    weighted_sum(a).backward(), weighted_sum(b).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("kwargs", COMPLEMENTARY)
def test_complementary_lif_as_theirs(kwargs: dict, step_mode: str, backend: str) -> None:
    theirs = sj_neuron.ComplementaryLIFNode(step_mode=step_mode, store_state_seqs=True, **kwargs).to(F64)
    mine = our.ComplementaryLIFNode(step_mode=step_mode, store_state_seqs=True, backend=backend, **kwargs)
    x, y = inputs(3)
    for _ in range(2):
        a, b = run(theirs, x, step_mode), run(mine, y, step_mode)
        assert torch.equal(a, b) and 0 < float(a.detach().mean()) < 1
    memories = dict(mine.named_memories())
    for name, value in theirs.named_memories():
        torch.testing.assert_close(memories[name], value, rtol=1e-13, atol=1e-13, msg=name)
    if step_mode == "m":
        for got, expected in zip(mine.state_seqs, theirs.state_seqs):
            torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
    else:
        assert mine.state_seqs is None and theirs.state_seqs is None
    weighted_sum(a).backward(), weighted_sum(b).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("name", ["NonSpikingIFNode", "NonSpikingLIFNode", "ComplementaryLIFNode"])
def test_signatures_are_theirs_then_backend(name: str) -> None:
    theirs, mine = _params(getattr(sj_neuron, name)), _params(getattr(our, name))
    assert mine[-1] == ("backend", None)
    _same_defaults(theirs, mine[:-1])


def test_liaf_signature_is_theirs_with_lifnodes_arguments_spelt_out() -> None:
    theirs = _params(sj_neuron.LIAFNode)[:2] + _params(sj_neuron.LIFNode)
    mine = _params(our.LIAFNode)
    assert mine[-1] == ("backend", None)
    _same_defaults(theirs, mine[:-1])


def _params(cls: type) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()][1:]


def _same_defaults(theirs: list[tuple[str, object]], mine: list[tuple[str, object]]) -> None:
    assert [n for n, _ in mine] == [n for n, _ in theirs]
    for (n, a), (_, b) in zip(theirs, mine):  # surrogates: the same class and parameters
        assert (ours.get_surrogate(a) == ours.get_surrogate(b)) if n == "surrogate_function" else a == b, n


@pytest.mark.parametrize(("build", "error", "argument"), [
    (lambda: our.NonSpikingIFNode(decode="max"), ValueError, "decode"),
    (lambda: our.NonSpikingLIFNode(tau=-1.0), ValueError, "parameter 'tau'"),
    (lambda: our.LIAFNode(torch.nn.ReLU(), True, tau=1.0), ValueError, "tau"),
    (lambda: our.LIAFNode("relu", True), TypeError, "act"),
    (lambda: our.ComplementaryLIFNode(tau=0.5), ValueError, "tau"),
])
def test_bad_arguments_are_refused_naming_them(build, error: type, argument: str) -> None:
    with pytest.raises(error, match=f"^{argument}"):
        build()
