"""Checking cases against the reference (`check_case`, `check_spec`) and the reports they give; see
`autocuda.testing` for the method."""
from __future__ import annotations

import functools
import math
import os
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ...codegen import noise
from ...codegen.broadcast import GRADIENT_GROUP, gradient_groups
from ...codegen.dtypes import get_dtype
from ...codegen.layout import Layout
from ...codegen.neuron_kernel import REPLAY_STEPS, KernelOptions, replay_steps
from ...runtime import reference
from ...runtime.neuron_launch import NeuronConfig
from ...runtime.tuning import fixed_layout, replay_option
from ...spec.derive import THRESHOLD, H, StepSystem
from ...spec.draws import system_draws
from ...spec.load import as_spec
from ...spec.model import NeuronSpec
from ...spec.surrogate import get_surrogate
from ...spec.torch_eval import evaluate
from .cases import CHECK_SEED, DTYPES, F64, TOLERANCES, Case, Inputs, Setup, Tolerance, make_case
from .named_launch import backward, forward


# -- checking -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """One output against the reference: `worst` is the largest error as a multiple of its tolerance."""

    name: str               # kernel and output, e.g. "bptt grad_x_seq"
    worst: float            # <= 1 passes (inf: a spike differs, or a value is NaN)
    max_abs: float          # largest |kernel - reference|
    compared: int           # values compared (ambiguous neurons excluded)
    failed: int             # values outside the tolerance

    @property
    def passed(self) -> bool:
        return self.failed == 0


@dataclass(frozen=True)
class CaseReport:
    label: str
    comparisons: tuple[Comparison, ...]
    neurons: int
    ambiguous: int          # neurons masked (partly, in forward) because a spike was within rounding

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def worst(self) -> float:
        return max((c.worst for c in self.comparisons), default=0.0)

    def describe(self) -> str:
        lines = [f"{self.label}: {'passed' if self.passed else 'FAILED'} (worst {self.worst:.3g} x tolerance, "
                 f"{self.ambiguous} of {self.neurons} neurons ambiguous)"]
        lines += [f"    {c.name}: {c.failed} of {c.compared} values off, max |error| {c.max_abs:.3g}, "
                  f"worst {c.worst:.3g} x tolerance" for c in self.comparisons if not c.passed]
        return "\n".join(lines)


@dataclass
class Report:
    """The cases of a check; `summary()` lists the failures, `raise_on_failure()` turns them into an error."""

    cases: list[CaseReport]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def failures(self) -> list[CaseReport]:
        return [c for c in self.cases if not c.passed]

    def summary(self) -> str:
        head = f"{len(self.cases)} cases, {len(self.failures)} failed"
        return "\n".join([head, *(c.describe() for c in self.failures)])

    def raise_on_failure(self) -> None:
        if not self.passed:
            raise AssertionError("generated kernels disagree with the reference: " + self.summary())


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float,
             scale: float | None = None) -> Comparison:
    if want.numel() == 0:
        return Comparison(name, 0.0, 0.0, 0, 0)
    scale = float(want.abs().max()) if scale is None else scale
    allowed = atol * (scale if scale > 0 else 1.0) + rtol * want.abs()
    diff = (got - want).abs()
    ratio = torch.nan_to_num(torch.where(diff == 0, 0.0, diff / allowed), nan=math.inf)  # x/0 -> inf
    return Comparison(name, float(ratio.max()), float(torch.nan_to_num(diff, nan=math.inf).max()),
                      want.numel(), int((~(diff <= allowed)).sum()))


def _reference_run(config: NeuronConfig, inputs: Inputs, params: Mapping[Any, Any], learnable: Mapping[str, Any],
                   storage: torch.dtype = F64) -> dict[str, torch.Tensor]:
    """Reference outputs and gradients (autograd, float64), named like the kernels' outputs, plus `threshold`. A
    step that draws gets the draws the kernels of `storage` make (in their arithmetic), seeded by CHECK_SEED."""
    d = config.derivation()
    system = d.system
    draws, neurons = system_draws(system), torch.arange(inputs.x.shape[1])
    xs = [u.clone().requires_grad_(True) for u in inputs.all_x]
    initial = [inputs.initial[s.name].clone().requires_grad_(True) for s in system.states]
    states = tuple(initial)
    rows: dict[str, list[torch.Tensor]] = {"spike_seq": [], "h_seq": [], "threshold": [], "spike_distance": []}
    for t in range(xs[0].shape[0]):
        step_inputs = tuple(u[t] for u in xs)
        values = {**params, **dict(zip(system.inputs, step_inputs)), **dict(zip(system.states, states))}
        threshold = evaluate(system.threshold, values).detach()
        rows["threshold"].append(torch.broadcast_to(threshold, step_inputs[0].shape))
        drawn = {draw.symbol: noise.draws(draw.kind, CHECK_SEED.seed, neurons, CHECK_SEED.offset + t, draw.site,
                                          storage).to(F64) for draw in draws}
        spike, states, h = reference.step(system, step_inputs, states, params, config.surrogate, d.detach_reset,
                                          drawn)
        rows["spike_distance"].append(_spike_distance(system, {**values, H: h.detach(), THRESHOLD: threshold}))
        rows["spike_seq"].append(spike)
        rows["h_seq"].append(h)
        for s, value in zip(system.states, states):
            rows.setdefault(f"{s.name}_seq", []).append(value)
    out = {k: torch.stack(v) for k, v in rows.items()}
    out |= {f"{s.name}_final": v for s, v in zip(system.states, states)}
    loss = (out["spike_seq"] * inputs.grad_spike).sum()
    loss = loss + sum((out[f"{s}_final"] * g).sum() for s, g in inputs.grad_final.items())
    loss = loss + sum((out[f"{s}_seq"] * g).sum() for s, g in inputs.grad_seq.items())
    leaves = [*xs, *initial, *learnable.values()]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    names = [*(f"grad_{key}" for key in config.input_keys), *(f"grad_{s.name}_init" for s in system.states),
             *(f"grad_{p}" for p in learnable)]
    out |= {n: torch.zeros_like(leaf) if g is None else g for n, g, leaf in zip(names, grads, leaves)}
    return {k: v.detach() for k, v in out.items()}


def _spike_distance(system: StepSystem, values: Mapping[Any, Any]) -> torch.Tensor:
    """How far h is from changing the spike: |h - threshold|, or for a multi-level spike the least over its
    levels of |a_k| / |∂a_k/∂h| (a level's argument a_k over its slope: the distance in h, where a_k is linear)."""
    if not system.levels:
        return (values[H] - values[THRESHOLD]).abs()
    distances = [(evaluate(level.argument, values) / evaluate(sympy.diff(level.argument, H), values)).abs()
                 for level in system.levels]
    return functools.reduce(torch.minimum, (torch.broadcast_to(d, values[H].shape) for d in distances))


def _kernel_run(config: NeuronConfig, inputs: Inputs, params: Mapping[str, Any], single: bool, backend: str,
                storage: torch.dtype, layout: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """Forward then backward through the launch layer; outputs as CPU float64, single-step ones as [1, N]."""
    device = torch.device("cuda" if backend == "cuda" else "cpu")

    def put(value: torch.Tensor) -> torch.Tensor:
        return (value[0] if single and value.dim() == 2 else value).to(device, storage).contiguous()

    xs, initial = [put(u) for u in inputs.all_x], {s: put(v) for s, v in inputs.initial.items()}
    params = {**params, **CHECK_SEED.arguments()}  # (a kernel that makes no draws takes none of them)
    fwd = forward(config, xs[0] if len(xs) == 1 else xs, initial, params, single_step=single,
                  store_state_seq=bool(inputs.grad_seq), save_for_backward=True, backend=backend, layout=layout)
    grads = {"grad_spike_seq": put(inputs.grad_spike),
             **{f"grad_{s}_final": put(g) for s, g in inputs.grad_final.items()},
             **{f"grad_{s}_seq": put(g) for s, g in inputs.grad_seq.items()}}
    saved = {**fwd, **dict(zip(config.input_keys, xs)), **{f"{s}_init": v for s, v in initial.items()}}
    bwd = backward(config, grads, saved, params, single_step=single, grad_state_seq=bool(inputs.grad_seq),
                   backend=backend, layout=layout)
    out = {name: value.detach().to("cpu", F64) for name, value in {**fwd, **bwd}.items()}
    return {name: v.unsqueeze(0) if single and name.endswith("_seq") else v for name, v in out.items()}


def _rounded(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    def r(v: torch.Tensor) -> torch.Tensor:
        return v.to(dtype).to(F64)
    return Inputs(r(inputs.x), {k: r(v) for k, v in inputs.initial.items()}, r(inputs.grad_spike),
                  {k: r(v) for k, v in inputs.grad_final.items()}, {k: r(v) for k, v in inputs.grad_seq.items()},
                  tuple(r(u) for u in inputs.more_x))


def _compare_run(config: NeuronConfig, inputs: Inputs, expected: dict[str, torch.Tensor],
                 actual: dict[str, torch.Tensor], tol: Tolerance, single: bool, segment: int = 0
                 ) -> tuple[list[Comparison], int]:
    """Every kernel output against the reference, ambiguous neurons masked (see the module doc). With a
    `segment`, <state>_checkpoints are compared with the reference's sequence every `segment` steps
    (`codegen.neuron_kernel.replay_steps`).

    atol is scaled by the largest value of the output's family, forward values (x, states, h) or gradients
    (incoming and outgoing): rounding errors are relative to the terms a result is summed from, and those can
    be far larger than the result (e.g. one neuron whose gradient terms nearly cancel)."""
    h, threshold = expected["h_seq"], expected["threshold"]
    ambiguous = expected["spike_distance"] <= tol.margin * (h.abs() + threshold.abs())
    steps = h.shape[0]
    first = torch.where(ambiguous.any(0), ambiguous.to(torch.uint8).argmax(0), steps)
    before_first = torch.arange(steps)[:, None] < first[None, :]
    clean = first == steps
    # A level whose argument does not hold h (a gate on a state) is infinitely far from changing: the scale takes
    # the finite distances only (the others as 0, which no largest magnitude is below: selecting the finite ones
    # would be boolean indexing, a threaded nonzero, slow on busy cores)
    distance = expected["spike_distance"]
    values = [*inputs.all_x, *inputs.initial.values(), torch.where(torch.isfinite(distance), distance, 0.0),
              *(v for k, v in expected.items() if not k.startswith("grad_") and k != "spike_distance")]
    grads = [inputs.grad_spike, *inputs.grad_final.values(), *inputs.grad_seq.values(),
             *(v for k, v in expected.items() if k.startswith("grad_"))]
    family = {False: max(float(v.abs().max()) for v in values if v.numel()),
              True: max(float(v.abs().max()) for v in grads)}
    shared = {f"grad_{name}" for name, per_neuron in config.tensors if not per_neuron}
    kernels = ("step-forward", "step-backward") if single else ("fptt", "bptt")
    results = []
    for name, got in actual.items():
        if name not in expected and not name.endswith("_checkpoints"):
            raise KeyError(f"kernel output {name!r} has no reference value")
        is_grad = name.startswith("grad_")
        want = expected[name] if name in expected else expected[f"{name[:-12]}_seq"]  # checkpoints: rows below
        kernel, scale = kernels[is_grad], family[is_grad]
        valid = before_first if name.endswith(("_seq", "_checkpoints")) and not is_grad else clean.expand_as(want)
        if name.endswith("_checkpoints"):  # rows K-1, 2K-1, ... of the state's sequence
            want, valid = (v[segment - 1::segment][:got.shape[0]] for v in (expected[f"{name[:-12]}_seq"], valid))
        valid = valid.reshape(-1)  # a flat mask: 2-D boolean indexing runs a threaded nonzero (slow on busy cores)
        if name in shared:  # one value for all neurons, which the kernel sums per group of neurons: what matters is
            # the sum, over the groups of valid neurons alone, of the per-neuron partials
            whole = _grouped(valid, True).all(1)
            want = _grouped(want.reshape(-1), 0).sum(1)
            got, want = got[whole].sum(0, keepdim=True), want[whole].sum(0, keepdim=True)
            scale = max(scale, float(expected[name].abs().sum()))
        else:
            got, want = got.reshape(-1)[valid], want.reshape(-1)[valid]
        exact = name == "spike_seq"
        results.append(_compare(f"{kernel} {name}", got, want, 0.0 if exact else tol.rtol,
                                0.0 if exact else tol.atol, scale))
    return results, int((~clean).sum())


def _grouped(values: torch.Tensor, fill: Any) -> torch.Tensor:
    """Per-neuron values [N] as rows of the kernels' groups of neurons (`GRADIENT_GROUP`), the last row filled up."""
    rows = gradient_groups(len(values))
    padded = values.new_full((rows * GRADIENT_GROUP,), fill)
    padded[:len(values)] = values
    return padded.view(rows, GRADIENT_GROUP)


def check_case(case: Case, backend: str = "host", config: NeuronConfig | None = None, single_step: bool = True
               ) -> CaseReport:
    """Compare the kernels of `case.setup` (or those of `config`, e.g. a test's mutated kernels) with the
    reference on the case's multi-step run and (unless `single_step` is False) its single step."""
    setup = case.setup
    config = config or setup.config()
    dtype = get_dtype(setup.dtype)
    storage, compute, tol = dtype.torch_dtype, dtype.compute.torch_dtype, TOLERANCES[dtype.name]
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    params_k: dict[str, Any] = {}   # what the kernel gets: scalars by value, tensors in the arithmetic dtype
    for name, value in case.params.items():
        params_k[name] = value.to(device, compute) if isinstance(value, torch.Tensor) else value
    neurons = case.multi.x.shape[1]
    system = config.derivation().system
    comparisons, ambiguous = [], 0
    runs = ((False, case.multi), (True, case.single)) if single_step else ((False, case.multi),)
    for single, inputs in runs:
        inputs = _rounded(inputs, storage)
        learnable = {p.name: _rounded_param(case.params[p.name], compute).expand(neurons).clone().requires_grad_(True)
                     for p in system.learnable}
        params_ref = {p: learnable.get(p.name, _rounded_param(case.params[p.name], compute)) for p in system.params}
        expected = _reference_run(config, inputs, params_ref, learnable, storage)
        actual = _kernel_run(config, inputs, params_k, single, backend, storage, dict(setup.layout) or None)
        segment = 0 if single else _replay_steps(config, setup, *inputs.x.shape)
        found, masked = _compare_run(config, inputs, expected, actual, tol, single, segment)
        comparisons += found
        ambiguous = max(ambiguous, masked)
    return CaseReport(case.label, tuple(comparisons), neurons, ambiguous)


def _replay_steps(config: NeuronConfig, setup: Setup, steps: int, n: int) -> int:
    """Steps between the rows of <state>_checkpoints: the setup's layout's, else what the launch chose."""
    layout = dict(setup.layout) if setup.layout else replay_option(n, steps)
    options = KernelOptions("fptt", get_dtype(setup.dtype), replay=layout.get("replay", REPLAY_STEPS))
    return replay_steps(config.derivation(), options)


def _rounded_param(value: Any, compute: torch.dtype) -> Any:
    """A parameter as the kernel holds it: scalars rounded to the arithmetic type, tensors stored in it."""
    if isinstance(value, torch.Tensor):
        return value.to(compute).to(F64)
    return float(torch.tensor(float(value), dtype=compute))

def check_spec(spec: NeuronSpec | str, backend: str = "host", *, dtypes: Iterable[str] = DTYPES,
               resets: Iterable[str] | None = None, detach: Iterable[bool] = (False, True), examples: int = 3,
               seed: int = 0, surrogate: Any = None, constants: Mapping[str, float] | None = None,
               per_neuron: bool = True, store_state_seq: bool = True, layout: Mapping[str, Any] | None = None,
               max_steps: int = 8, max_neurons: int = 33, raise_on_failure: bool = False) -> Report:
    """Run the generated FPTT/BPTT and single-step kernels of `spec` on `backend` ("host": the CPU through the
    shim; "cuda": the GPU) against the float64 reference, for every dtype x reset x detach_reset, on `examples`
    random cases each (the first with T = 1, the second with N = 1, the others with the second's T, drawn per
    setup, so that they share its kernels). Default resets: the spec's, plus hard
    (when it has v_reset) and soft. `layout` forces kernel layout options (e.g. {"lanes": 4, "vector": True};
    N must then suit them); by default the launch layer chooses. Returns a Report (per case: each output's
    largest error as a multiple of its tolerance); with `raise_on_failure`, failures raise AssertionError."""
    spec = as_spec(spec)
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if resets is None:
        has_v_reset = any(p.name == "v_reset" for p in spec.params)
        resets = dict.fromkeys([spec.reset, *(["hard"] if has_v_reset else []), "soft"])
    dtypes, resets = _several("dtypes", dtypes, str, "a name"), _several("resets", resets, str, "a name")
    detach = _several("detach", detach, bool, "True, False")
    examples, seed = _integer("examples", examples, 1), _integer("seed", seed)
    max_steps = _integer("max_steps", max_steps, 1, MAX_STEPS)
    max_neurons = _integer("max_neurons", max_neurons, 1, MAX_VALUES // max_steps)
    chosen = get_surrogate(surrogate) if surrogate is not None else None
    frozen = tuple(sorted(_constants(constants or {}).items()))
    multiple = (layout or {}).get("lanes", 1) if (layout or {}).get("vector") else 1   # vector access needs it
    jobs = []
    for dtype in dtypes:
        for reset in resets:
            for detach_reset in detach:
                setup = Setup(spec, get_dtype(dtype).name, reset, bool(detach_reset), chosen, frozen, per_neuron,
                              store_state_seq, tuple(sorted((layout or {}).items())))
                steps = _steps(zlib.crc32(f"{seed} {setup.label}".encode()), max_steps)
                for i in range(examples):
                    case_seed = zlib.crc32(f"{seed} {setup.label} {i}".encode())
                    jobs.append((setup, _shape(i, case_seed, steps, max_neurons, multiple), case_seed))
    # Host kernels compile in compiler processes and run with the GIL released: threads overlap both.
    workers = (os.cpu_count() or 2) if backend == "host" else 1
    if backend == "host":
        _compile_host_kernels(jobs)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        report = Report(list(pool.map(lambda job: check_case(make_case(*job), backend), jobs)))
    if raise_on_failure:
        report.raise_on_failure()
    return report


BACKENDS = ("host", "cuda")
MAX_STEPS = 10_000  # a case's T at most (the reference steps through T in Python)
MAX_VALUES = 1 << 22  # max_steps x max_neurons at most: a case's [T, N] tensors stay a few MiB each


def _several(field: str, given: Any, kind: type, what: str) -> tuple[Any, ...]:
    """Values of `kind` given one or several (an iterable), at least one: nothing checked passes nothing."""
    values = (given,) if isinstance(given, kind) else tuple(given) if isinstance(given, Iterable) else None
    if values is None or not all(isinstance(value, kind) for value in values):
        raise TypeError(f"{field}: expected {what} or an iterable of them, got {given!r}")
    if not values:
        raise ValueError(f"{field}: none given, so nothing would be checked")
    return values


def _constants(constants: Any) -> dict[str, float]:
    """Parameters to fold in, by name (the derivation refuses one the spec lacks), each a real number."""
    if not isinstance(constants, Mapping):
        raise TypeError(f"constants: expected a mapping of parameter names to numbers, got {type(constants).__name__}")
    for name, value in constants.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"constants: {name!r} must be a number, got {type(value).__name__}")
    return {name: float(value) for name, value in constants.items()}


def _integer(field: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool) within [low, high] where given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: expected an int, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{field}: expected {bounds}, got {value}")
    return value


def _compile_host_kernels(jobs: Iterable[tuple[Setup, tuple[int, int], int]]) -> None:
    """The host kernels that the jobs' cases launch (as `_kernel_run` does), compiled up front, many to a compiler
    run (`load_kernels`): the cases would compile them one by one. Kernels of a shape whose layout depends on its
    tensors are left to compile when launched."""
    from ...toolchain.host import load_kernels

    found = {}
    for setup, (steps, neurons), _ in jobs:
        config, storage = setup.config(), get_dtype(setup.dtype).torch_dtype
        seqs = setup.store_state_seq
        for kind, flags, loop in (("fptt", (seqs, True, True, True), steps), ("bptt", (seqs, True, True), steps),
                                  ("step-forward", (False, True, True, True), None),
                                  ("step-backward", (False, True, True), None)):
            layout = Layout.of(dict(setup.layout)) if setup.layout else fixed_layout(neurons, loop)
            if layout is not None:
                kernel = config.recipe(kind, storage, flags, layout).kernel
                found[kernel.kernel_name] = (kernel.full_codes, kernel.kernel_name, tuple(kernel.cparams.values()))
    load_kernels(found.values())


def _steps(seed: int, max_steps: int) -> int:
    """The T of a setup's examples after the first, drawn once per setup: they share its kernels (a T below a replay
    segment compiles kernels replaying T steps, one pair per T)."""
    return int(torch.randint(1, max_steps + 1, (), generator=torch.Generator().manual_seed(seed)))


def _shape(example: int, seed: int, steps: int, max_neurons: int, multiple: int = 1) -> tuple[int, int]:
    """Example 0 has T = 1, example 1 has N = 1 (or `multiple`), the others T = `steps` and N drawn from `seed`; N
    is odd (a packed pair's lone lane) unless it must be a multiple of `multiple`."""
    generator = torch.Generator().manual_seed(seed)
    neurons = int(torch.randint(1, max_neurons + 1, (), generator=generator)) | 1
    if multiple > 1:
        neurons = multiple * max(1, neurons // multiple)
    return {0: (1, neurons), 1: (steps, multiple)}.get(example, (steps, neurons))
