"""The call path across threads, and what its caches keep alive (CPU, the host runner; float64, so that results
compare bitwise). Threads: several Python threads at once call the functional API, one layer, and distinct layers of
one configuration, with shapes, dtypes and grad modes that make programs, bound launches, forms and native plans at
the same time, while the caches that hold them clear at their limits (made small here): every call gets what a
single thread gets, none raises, none hangs (joins have a generous timeout: a hang fails, never blocks the run).
Lifetimes: a deleted layer's tensors are freed (also after a backward, native or not); functional calls' fresh spec
and surrogate objects are neither kept alive nor grow the caches without bound; a replaced parameter is taken and the
old one released; functional calls' programs keep none of their tensor parameters (`Programs.keeps_tensors`)."""
from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from conftest import profile

from autocuda import nn as ann
from autocuda import surrogate as sg
from autocuda.call import functional as F
from autocuda.call import native, ops, program
from autocuda.runtime import configs, neuron_launch
from autocuda.spec.load import load_spec
from autocuda.toolchain.host import cxx

pytestmark = pytest.mark.skipif(cxx.missing() is not None, reason=f"host runner unavailable: {cxx.missing()}")

F64 = torch.float64
JOIN = 300.0  # seconds: a guard against a hang, never reached by a run that works


def in_threads(jobs: Sequence[Callable[[], Any]], rounds: int = 1) -> list[Any]:
    """Each job run `rounds` times in a thread of its own, all started at once (a barrier): their results in order;
    the first exception raised in a thread is raised here; a thread still running after `JOIN` seconds fails."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def work(i: int) -> None:
        try:
            start.wait(JOIN)
            results[i] = [jobs[i]() for _ in range(rounds)]
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN)
    if any(thread.is_alive() for thread in threads):
        pytest.fail("a thread hung (deadlock?)")
    if errors:
        raise errors[0]
    return results


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return a == b


# -- the jobs: functional calls of several classes (shape, dtype, grad mode, tensor parameters) -----------------
def functional_job(shape: tuple[int, ...], dtype: torch.dtype, train: bool, tensor_threshold: bool,
                   single: bool = False, seed: int = 0) -> Callable[[], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x0 = torch.rand(shape, generator=generator, dtype=dtype) * 2
    threshold = torch.tensor([0.9], dtype=dtype) if tensor_threshold else 0.9

    def job() -> list[torch.Tensor]:
        x = x0.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            if single:
                spike, states = F.single_step("lif", x, backend="host", v_threshold=threshold, tau=2.0)
                finals = list(states)
            else:
                spike, kept, _ = F.multi_step("lif", x, backend="host", v_threshold=threshold, tau=2.0)
                finals = list(kept)
        if not train:
            return [spike, *finals]
        weights = torch.arange(1, spike.numel() + 1, dtype=dtype).view(spike.shape)
        (grad,) = torch.autograd.grad((spike * weights).sum() + sum(f.sum() for f in finals), [x])
        return [spike.detach(), *(f.detach() for f in finals), grad]
    return job


def jobs_of_many_classes() -> list[Callable[[], list[torch.Tensor]]]:
    classes = [((5, 12), F64, False, False), ((5, 12), F64, True, False), ((5, 3, 4), F64, True, True),
               ((4, 12), F64, False, True), ((5, 12), torch.float32, True, False), ((12,), F64, True, False, True),
               ((3, 4), F64, False, False, True), ((5, 12), F64, True, True)]
    return [functional_job(*c, seed=i) for i, c in enumerate(classes)]  # type: ignore[misc]


@pytest.fixture
def small_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches that clear every few entries: programs, configuration numbers, bound launches, forms' native plans."""
    monkeypatch.setattr(program.Programs, "LIMIT", 3)
    monkeypatch.setattr(neuron_launch, "_MAX_LAUNCHES", 2)
    if hasattr(ops.NativePlans, "LIMIT"):
        monkeypatch.setattr(ops.NativePlans, "LIMIT", 2)
    program.PROGRAMS.clear()
    yield
    program.PROGRAMS.clear()


def check_functional_calls_in_threads() -> None:
    jobs = jobs_of_many_classes()
    alone = [[job() for _ in range(3)] for job in jobs]  # also compiles every kernel first
    program.PROGRAMS.clear()
    together = in_threads(jobs, rounds=3)
    for got, want in zip(together, alone, strict=True):
        assert same(got, want)


def test_functional_calls_of_many_classes_in_threads_while_caches_clear(small_caches):
    check_functional_calls_in_threads()


def test_native_functional_calls_of_many_classes_in_threads_while_caches_clear(native_on_host, small_caches):
    check_functional_calls_in_threads()


def test_a_native_plan_dropped_by_another_thread_between_test_and_read_is_made_again(native_on_host, monkeypatch):
    """A form's native plans (`ops.NativePlans`, the op implementation's path: here a training call's backward) clear
    at their limit in whichever thread makes one more: a thread that found its key present must not then fail to
    read it (KeyError). The interleaving is made certain: the membership test answers, then the plans are cleared,
    as another thread at the limit would clear them."""
    monkeypatch.setattr(program, "ENABLED", False)  # no program plans: each backward runs the op's, by the form's
    job = functional_job((5, 12), F64, True, False, seed=1)
    want = job()
    job()  # the plans of its classes are made
    forgetful = ops.NativePlans.__contains__

    def contains_then_cleared(self, key):
        found = forgetful(self, key)
        self.clear()
        return found

    asked = []
    operator = native.operator

    def counted(name: str = "call"):
        asked.append(name)
        return operator(name)

    monkeypatch.setattr(ops.NativePlans, "__contains__", contains_then_cleared)
    monkeypatch.setattr(native, "operator", counted)
    assert same(job(), want)
    assert "op_call" in asked  # a form's plan ran the backward


# -- layers in threads ------------------------------------------------------------------------------------------
def layer_job(layer: torch.nn.Module, x0: torch.Tensor, train: bool, grads_of: Sequence[str] = ()
              ) -> Callable[[], list[torch.Tensor]]:
    def job() -> list[torch.Tensor]:
        x = x0.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            spikes = layer(x)
        if not train:
            return [spikes]
        weights = torch.arange(1, spikes.numel() + 1, dtype=x.dtype).view(spikes.shape)
        wrt = [x, *(getattr(layer, name) for name in grads_of)]
        return [spikes.detach(), *torch.autograd.grad((spikes * weights).sum(), wrt)]
    return job


def one_layer_jobs() -> list[Callable[[], list[torch.Tensor]]]:
    """One layer (no states kept between calls: each call starts afresh, whatever thread called before), called in
    several input classes (shapes, dtypes, grad modes)."""
    layer = ann.ParametricLIFNode(step_mode="m", backend="host").double()
    layer.store_final_states = False
    g = torch.Generator().manual_seed(2)
    classes = [((5, 12), F64, True), ((5, 12), F64, False), ((4, 3, 4), F64, True), ((5, 6), torch.float32, False),
               ((5, 12), F64, True), ((6, 2, 6), F64, False)]
    return [layer_job(layer, torch.rand(shape, generator=g, dtype=dtype) * 2, train, ("w",) if train else ())
            for shape, dtype, train in classes]


def layers_of_one_configuration_jobs() -> list[Callable[[], list[torch.Tensor]]]:
    """Distinct layers of one configuration (a tensor threshold of one value: kept tensor arguments), states kept
    between a layer's calls (each layer has a thread of its own)."""
    g = torch.Generator().manual_seed(3)
    jobs = []
    for i, (shape, train) in enumerate([((5, 12), False), ((5, 12), True), ((5, 3, 4), False), ((4, 12), True),
                                        ((5, 12), False)]):
        layer = ann.LIFNode(step_mode="m", backend="host").double()
        layer.v_threshold = torch.tensor(0.8 + 0.05 * i, dtype=F64)
        x = torch.rand(shape, generator=g, dtype=F64) * 2
        jobs.append(layer_job(layer, x, train))
    step_layer = ann.LIFNode(step_mode="s", backend="host").double()
    jobs.append(layer_job(step_layer, torch.rand(12, generator=g, dtype=F64) * 2, False))
    return jobs


@pytest.mark.parametrize("path", ["python", "native"])
@pytest.mark.parametrize("make", [one_layer_jobs, layers_of_one_configuration_jobs], ids=["one", "distinct"])
def test_layers_called_in_threads_while_caches_clear_get_the_single_threaded_results(make, path, small_caches,
                                                                                     request):
    if path == "native":
        request.getfixturevalue("native_on_host")
    want = [[job() for _ in range(4)] for job in make()]  # a thread per layer: its calls in order
    got = in_threads(make(), rounds=4)
    for a, b in zip(got, want, strict=True):
        assert same(a, b)


# -- lifetimes ------------------------------------------------------------------------------------------------------
def alive(refs: Sequence[weakref.ref]) -> list[bool]:
    gc.collect()
    return [ref() is not None for ref in refs]


def test_functional_calls_keep_no_user_tensor_parameter_alive():
    """A functional call of a bound program (its second call of a key) with a tensor parameter of one value: its
    program, kept by the module's `PROGRAMS`, must not keep the caller's tensor (nor, through a view, the tensor it is
    a view of) once the call returns (it was kept until 1024 other programs were made)."""
    x = torch.rand(5, 12, dtype=F64) * 2
    with torch.no_grad():
        for _ in range(3):
            threshold = torch.tensor([0.9], dtype=F64)
            big = torch.ones(1000, dtype=F64)  # a parameter that is a view of a larger tensor keeps all of it
            spikes, _, _ = F.multi_step("lif", x, backend="host", v_threshold=threshold, tau=big[3:4])
            refs = [weakref.ref(threshold), weakref.ref(big), weakref.ref(spikes)]
            del threshold, big, spikes
            assert alive(refs) == [False] * 3


def test_fresh_surrogates_and_specs_of_functional_calls_are_not_kept_and_do_not_grow_the_caches(monkeypatch):
    """A fresh surrogate object per call (the usual `surrogate=sg.Sigmoid()`) and fresh spec objects of one content:
    each was kept for ever by the refs' memos and the constants' cache (by its id, so that the id could not name
    another object), which grew by one per call without bound. The key holds references (tokens of the values) now:
    a new object of the same values is the same configuration, and the memos keep the last few objects only."""
    monkeypatch.setattr(configs, "_REFS_LIMIT", 8, raising=False)
    x = torch.rand(5, 12, dtype=F64) * 2
    base = load_spec("lif")
    refs = []
    with torch.no_grad():
        want = F.multi_step(base, x, backend="host", surrogate=sg.Sigmoid(alpha=4.0))[0]
        before = len(program.PROGRAMS)
        for i in range(40):
            surrogate, spec = sg.Sigmoid(alpha=4.0), dataclasses.replace(base)
            got = F.multi_step(spec, x, backend="host", surrogate=surrogate)[0]
            assert torch.equal(got, want)
            if i < 5:
                refs += [weakref.ref(surrogate), weakref.ref(spec)]
        del surrogate, spec
    assert alive(refs) == [False] * len(refs)
    assert len(program.PROGRAMS) == before  # one configuration: no program per object
    assert len(configs._SURROGATE_REFS) <= 8 and len(configs._SPEC_REFS) <= 8
    assert len(program._CONSTANTS) <= program.Programs.LIMIT


def test_a_surrogate_changed_in_place_takes_new_kernels_in_functional_calls():
    """Keyed by its values' reference, a surrogate changed in place (a new version) is another configuration."""
    x = torch.rand(5, 12, dtype=F64, requires_grad=True)
    surrogate = sg.Sigmoid(alpha=4.0)

    def grad() -> torch.Tensor:
        spikes = F.multi_step("lif", x, backend="host", surrogate=surrogate)[0]
        return torch.autograd.grad(spikes.sum(), x)[0]

    first = grad()
    surrogate.alpha = 2.0
    changed = grad()
    fresh = sg.Sigmoid(alpha=2.0)
    spikes = F.multi_step("lif", x, backend="host", surrogate=fresh)[0]
    assert torch.equal(changed, torch.autograd.grad(spikes.sum(), x)[0]) and not torch.equal(first, changed)


@pytest.mark.parametrize("path", ["python", "native"])
def test_a_deleted_layer_frees_its_tensors_also_after_backward(path, request):
    """Parameters, a tensor threshold, states, inputs, outputs and kept tensor arguments of a layer called for
    inference (bound, keyed calls) and for training (a backward through a native node where the path is native):
    freed once the layer and the caller's names are gone."""
    if path == "native":
        request.getfixturevalue("native_on_host")
    layers = [ann.ParametricLIFNode(step_mode="m", backend="host").double(),  # learnable w
              ann.LIFNode(step_mode="m", backend="host").double()]  # its threshold: a kept tensor argument
    layers[1].v_threshold = torch.tensor(0.9, dtype=F64)
    refs = []
    for layer in layers:
        x = torch.rand(5, 12, dtype=F64) * 2
        outs = []
        with torch.no_grad():
            for _ in range(3):
                layer.reset()  # from numbers: bound calls that keep tensor arguments
                outs.append(layer(x))
        trained = x.clone().requires_grad_(True)
        for _ in range(3):
            spikes = layer(trained)
            spikes.sum().backward()
            layer.detach()
        kept = [t for p in layer.__dict__["_programs"].values() if p.kept_tensors for t in p.kept_tensors[2]]
        refs += [weakref.ref(t) for t in (*layer.parameters(), layer.v_threshold, layer.v, x, trained, spikes, *outs,
                                          *kept) if isinstance(t, torch.Tensor)]
    assert kept or path == "native"  # (native calls take the parameters as given)
    del layers, layer, x, trained, spikes, outs, kept
    assert alive(refs) == [False] * len(refs)


def test_a_replaced_parameter_is_taken_and_the_old_one_released():
    layer = ann.LIFNode(step_mode="m", backend="host").double()
    layer.store_final_states = False
    x = torch.rand(5, 12, dtype=F64) * 2
    with torch.no_grad():
        old = layer.v_threshold = torch.tensor(0.9, dtype=F64)
        for _ in range(3):
            first = layer(x)
        ref = weakref.ref(old)
        del old
        layer.v_threshold = torch.tensor(0.5, dtype=F64)
        second = [layer(x) for _ in range(3)]
        want = F.multi_step("lif", x, backend="host", v_threshold=0.5)[0]
    assert all(torch.equal(s, want) for s in second) and not torch.equal(first, want)
    assert alive([ref]) == [False]


@pytest.mark.skipif(profile() != "slow", reason="a longer sweep of threads and classes: --slow")
@pytest.mark.parametrize("path", ["python", "native"])
def test_many_rounds_of_functional_calls_in_threads(path, small_caches, request):
    if path == "native":
        request.getfixturevalue("native_on_host")
    for _ in range(5):
        jobs = jobs_of_many_classes() * 2
        want = [[job() for _ in range(6)] for job in jobs]
        assert same(in_threads(jobs, rounds=6), want)
