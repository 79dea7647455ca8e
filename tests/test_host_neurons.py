"""The emitted neuron kernels, run on the CPU through autocuda.toolchain.host, match the reference (issue 5, design.md
§6).

Hypothesis property tests (random shapes, parameters and inputs, plus explicit T = 1, N = 1 and N = 601 examples)
of FPTT -> BPTT and of step-forward -> step-backward, compared by `autocuda.testing.check_case` (float64 autograd
oracle), for setups of shipped spec x {float32, float64, float16, bfloat16} x {hard, soft} x detach_reset:

- with --slow, every one of them (the full product);
- by default, a covering set: four setups of each spec, one per dtype (its equations printed in each arithmetic
  type), that hold each of its (reset, detach_reset) pairs once, each reset rule in a tight dtype (float64 or
  float32: its derived resets and their gradients against the reference at a tight tolerance) and in a half one,
  chosen so that every (dtype, reset, detach_reset) of the full product is held too (`default_setups`). So each
  pair of spec, dtype and (reset, detach_reset) that the full product holds is checked together
  (`test_the_default_setups_hold_every_pair_of_the_full_product` checks it); conftest's REPRESENTATIVE_SPECS
  run every explicit example in every setup.

Each setup's multi-step kernels run on every example. Its single-step kernels (step-forward -> step-backward) with
--slow, for REPRESENTATIVE_SPECS and in each spec's float64 setup; by default not in a spec's other setups: a
single-step kernel prints the spec's equations as one step of the multi-step kernels of its setup does (checked
there), within a skeleton that the equations do not change (checked in every setup of REPRESENTATIVE_SPECS, in every
dtype), and `test_kernels_without_state_sequences` runs the single step in another setup of each spec
(`single_step_checked`).

Cost is compilation: kernels do not depend on shapes or values, so each (setup, kernel) compiles once (cached on
disk under $AUTOCUDA_CACHE_DIR/host); a module fixture compiles them all up front, in a compiler run per core
of this process at once (`conftest.host_group`, `conftest.cores`). The explicit examples share their kernels where
they can: a T below a replay segment compiles a kernel replaying T steps, so they take two values of T, not three.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import zlib
from collections.abc import Iterator

import pytest
from conftest import REPRESENTATIVE_SPECS, cores, examples, host_group, profile
from hypothesis import HealthCheck, Phase, example, given, seed, settings

from autocuda.codegen.neuron_kernel import NeuronKernel
from autocuda.runtime import reference
from autocuda.runtime.tuning import fixed_layout
from autocuda.spec.load import list_specs, load_spec
from autocuda.spec.model import NeuronSpec, reset_rules
from autocuda.toolchain.host import load_kernels, runner
from autocuda.tools.testing import Setup, cases, check_case, check_spec, make_case

SPECS = [name for name, _ in list_specs()]
DTYPES = ("float32", "float64", "float16", "bfloat16")
RESETS = ("hard", "soft")


def spec_resets(name: str) -> tuple[str, ...]:
    """Hard and soft, or where a spec has no v_reset (no hard reset), its own rule and soft."""
    rules = reset_rules(load_spec(name))
    return RESETS if "hard" in rules else rules[:2]


CaseKey = tuple[str, str, str, bool]  # spec, dtype, reset, detach_reset
FULL = [(name, dtype, reset, detach) for name in SPECS for reset in spec_resets(name) for dtype in DTYPES
        for detach in (False, True)]


# The default setups: four of each spec, one per dtype, one per (reset, detach_reset) pair of it (a Latin square),
# each reset rule in a tight dtype and in a half one: a rule gets one of these pairs of dtypes, the spec's other
# rule the other pair, and the tight and half setups of a rule opposite detach_reset values. Of the 8 such designs a
# spec could take, it takes the one that adds the most (dtype, reset, detach_reset) triples not yet held, counting a
# triple of a rarer reset rule (fewer specs have it) for more; specs with rarer rules choose first.
DTYPE_PAIRS = (("float64", "float16"), ("float32", "bfloat16"))


def designs(name: str) -> Iterator[tuple[CaseKey, ...]]:
    """The 8 candidate sets of four setups of a spec, in a fixed order."""
    rules = spec_resets(name)
    for first in (0, 1):
        for detach in itertools.product((False, True), repeat=2):
            pairs = (DTYPE_PAIRS[first], DTYPE_PAIRS[1 - first])
            yield tuple(setup for rule, (tight, half), flag in zip(rules, pairs, detach)
                        for setup in ((name, tight, rule, flag), (name, half, rule, not flag)))


def default_setups() -> list[CaseKey]:
    """The default profile's setups (see the comment above)."""
    rarity = collections.Counter(rule for name in SPECS for rule in spec_resets(name))
    held: set[tuple[str, str, bool]] = set()
    chosen: set[CaseKey] = set()
    for name in sorted(SPECS, key=lambda n: (min(rarity[r] for r in spec_resets(n)), SPECS.index(n))):
        def gain(design: tuple[CaseKey, ...]) -> float:
            return sum(1 / rarity[k[2]] for k in design if k[1:] not in held)
        best = max(designs(name), key=gain)  # the first of the best: max keeps the first of equals
        held.update(k[1:] for k in best)
        chosen.update(best)
    return [key for key in FULL if key in chosen]


CHOSEN = FULL if profile() == "slow" else default_setups()
# Few examples (compilation dominates, and each case already covers T x N values): 3 drawn ones with --slow beside
# the test's explicit edge cases; by default the explicit ones alone (hypothesis's first draw would be its simplest
# case, T = 1 and N = 1: one more T = 1 case). Each setup gets its own fixed seed (see the test), so CI is
# reproducible yet setups do not all draw the same shapes. No deadline: the first example of a setup may compile.
PROPERTY = settings(max_examples=examples(3, 1), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow],
                    phases=tuple(Phase) if profile() == "slow" else (Phase.explicit,))

# A user's spec as Python objects: three states, an adaptive threshold, a learnable per-neuron time constant
# and an update that reads h and s (what check_spec must handle beyond the shipped specs).
USER_SPEC = NeuronSpec(
    name="user_adaptive", charge="v + (x - (v - v_reset) + c) / tau", threshold="v_threshold + beta * a",
    params={"tau": {"default": 2.0, "learnable": True}, "beta": 0.3, "rho": 0.8, "v_threshold": 1.0,
            "v_reset": 0.0},
    states={"v": "v_reset", "a": 0.0, "c": 0.0},
    updates={"a": "rho * a + s", "c": "0.5 * c + 0.1 * h - 0.2 * s"})


# Layouts the launch layer picks only for large N (vector accesses, several neurons per thread, prefetching).
FORCED_LAYOUTS = [("alif", "float32", {"lanes": 4, "vector": True, "prefetch": 2}),
                  ("parametric_lif", "float16", {"lanes": 8, "vector": True, "unroll": 2})]


# The shapes (T, N) of the property's explicit examples: T = 1, where no step has a predecessor; N = 1, a packed
# pair with only its first lane; three blocks of 256 threads, the last one partly idle. The last two share T (one
# kernel replaying T steps for both).
EXAMPLES = ((1, 7), (6, 1), (6, 601))


def single_step_checked(key: CaseKey) -> bool:
    """Whether a setup is checked whole: all the explicit examples and the single-step kernels (module doc). With
    --slow, for REPRESENTATIVE_SPECS (every dtype, reset and detach_reset) and for each other spec's float64 setup."""
    return profile() == "slow" or key[0] in REPRESENTATIVE_SPECS or key[1] == "float64"


def examples_of(key: CaseKey) -> tuple[tuple[int, int], ...]:
    """The explicit examples of a setup: all of them where it is checked whole (`single_step_checked`); the other
    setups leave out T = 1 (kernels of their own, replaying one step)."""
    return EXAMPLES if single_step_checked(key) else EXAMPLES[1:]


def _kernels(setup: Setup, shapes: tuple[tuple[int, int], ...] = EXAMPLES, single_step: bool = True
             ) -> list[NeuronKernel]:
    """The kernels check_case launches for `setup` on cases of these shapes (with the options runtime.neuron_launch
    passes): its forced layout, else the launch layer's fixed rule for too few neurons for two per thread (every
    case here), whose time-loop kernels replay one segment of T steps where T is shorter than a segment; the
    single-step kernels where `single_step`."""
    config, seqs = setup.config(), setup.store_state_seq
    kernels = []
    for steps, neurons in shapes:
        layout = dict(setup.layout) or fixed_layout(neurons, steps).options()  # type: ignore[union-attr]
        kernels += [config.kernel("fptt", setup.dtype, store_state_seq=seqs, save_for_backward=True, **layout),
                    config.kernel("bptt", setup.dtype, grad_state_seq=seqs, **layout)]
    if not single_step:
        return kernels
    layout = dict(setup.layout) or fixed_layout(1, None).options()  # type: ignore[union-attr]
    return kernels + [
        config.kernel("step-forward", setup.dtype, store_state_seq=False, save_for_backward=True, **layout),
        config.kernel("step-backward", setup.dtype, grad_state_seq=False, **layout)]


@functools.cache
def default_path_setups() -> tuple[Setup, ...]:
    """The setups `test_kernels_without_state_sequences` checks on explicit examples (`default_path_examples`), in
    both profiles: for each spec outside REPRESENTATIVE_SPECS, its dtype of `default_path_dtypes` with the reset and
    detach_reset of its property setup in that dtype (one of the default setups: so the single-step kernels, which
    write no state sequences on either path, are the property's)."""
    setups, default = [], default_setups()
    for name in SPECS:
        if name not in REPRESENTATIVE_SPECS:
            (dtype,) = default_path_dtypes(name, run="default")
            (key,) = [key for key in default if key[0] == name and key[1] == dtype]
            setups.append(Setup(load_spec(name), dtype, key[2], key[3], store_state_seq=False))
    return tuple(setups)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """Compile the kernels of the property's examples and of `default_path_setups` up front, many to a compiler run
    (`conftest.host_group`) and a run per core of this process (`load_kernels`, `conftest.cores`); the cases would
    compile them one kernel a run. The other tests go through check_spec, which compiles its cases' kernels up front
    itself."""
    kernels = [k for key in CHOSEN
               for k in _kernels(Setup(load_spec(key[0]), *key[1:]), examples_of(key), single_step_checked(key))]
    kernels += [k for setup in default_path_setups() for k in _kernels(setup, default_path_examples())]
    jobs = {k.kernel_name: (k.full_codes, k.kernel_name, tuple(k.cparams.values())) for k in kernels}
    load_kernels(jobs.values(), group=host_group(len(jobs)), workers=cores())
    return len(jobs)


@pytest.mark.parametrize(("name", "dtype", "reset", "detach_reset"), CHOSEN,
                         ids=[f"{n}-{r}-{d}-{'detach_reset' if x else 'attached'}" for n, d, r, x in CHOSEN])
def test_kernels_match_reference(name: str, dtype: str, reset: str, detach_reset: bool) -> None:
    setup = Setup(load_spec(name), dtype, reset, detach_reset)
    single_step = single_step_checked((name, dtype, reset, detach_reset))

    def check(case):
        report = check_case(case, single_step=single_step)
        assert report.passed, report.describe()

    for shape in examples_of((name, dtype, reset, detach_reset)):  # as @example decorators
        check = example(case=make_case(setup, shape, seed=1 + EXAMPLES.index(shape)))(check)
    PROPERTY(seed(zlib.crc32(setup.label.encode()))(given(case=cases(setup))(check)))()


def launched_kernels(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the host kernels launched from now on (filled in as they launch)."""
    launched: set[str] = set()
    load = runner.load_kernel
    monkeypatch.setattr(runner, "load_kernel", lambda source, name, params: (launched.add(name),
                                                                              load(source, name, params))[1])
    return launched


def test_the_module_fixture_compiles_the_kernels_the_examples_launch(monkeypatch):
    """Every kernel the property's examples launch is among those `compiled_kernels` compiles up front."""
    setup = Setup(load_spec("alif"), "float32", "hard", False)
    launched = launched_kernels(monkeypatch)
    for seed_, shape in enumerate(EXAMPLES):
        assert check_case(make_case(setup, shape, seed=seed_)).passed
    assert launched and launched <= {k.kernel_name for k in _kernels(setup)}


def test_the_module_fixture_compiles_the_kernels_the_default_path_examples_launch(monkeypatch):
    """So are those of `default_path_setups`' examples."""
    setup = default_path_setups()[0]
    launched = launched_kernels(monkeypatch)
    for seed_, shape in enumerate(default_path_examples()):
        assert check_case(make_case(setup, shape, seed=seed_)).passed
    assert launched and launched <= {k.kernel_name for k in _kernels(setup, default_path_examples())}


def test_check_spec_compiles_the_kernels_its_cases_launch_up_front(monkeypatch):
    """Many to a compiler run (`load_kernels`), before the cases run: a case then compiles none of its own."""
    import autocuda.toolchain.host

    ahead: set[str] = set()
    load_many = autocuda.toolchain.host.load_kernels

    def load_kernels_seen(jobs, *args, **kwargs):
        jobs = list(jobs)
        ahead.update(name for _, name, _ in jobs)
        return load_many(jobs, *args, **kwargs)

    monkeypatch.setattr(autocuda.toolchain.host, "load_kernels", load_kernels_seen)
    launched = launched_kernels(monkeypatch)
    check_spec("alif", dtypes=("float32",), resets=("hard",), detach=(False,), examples=3, raise_on_failure=True)
    assert launched and launched <= ahead


@pytest.mark.parametrize(("arguments", "error", "names"), [
    ({"examples": 0}, ValueError, "examples"),  # no case: a report that passes having checked nothing
    ({"examples": 1.5}, TypeError, "examples"),
    ({"dtypes": ()}, ValueError, "dtypes"),
    ({"detach": ["yes"]}, TypeError, "detach"),  # truthy text is no switch
    ({"resets": [None]}, TypeError, "resets"),
    ({"max_steps": 0}, ValueError, "max_steps"),  # torch's randint error, unnamed, before
    ({"max_neurons": 10**9}, ValueError, "max_neurons"),  # [T, N] float64 tensors of gigabytes, before
    ({"seed": "x"}, TypeError, "seed"),
    ({"constants": {"tau_typo": 2.0}}, ValueError, "tau_typo"),  # folded nowhere, silently, before
    ({"backend": "gpu"}, ValueError, "backend"),
])
def test_check_spec_refuses_arguments_that_would_check_nothing_or_crash_by_name(arguments, error, names) -> None:
    with pytest.raises(error, match=names):
        check_spec("lif", **{"dtypes": "float64", **arguments})
    with pytest.raises(TypeError, match="spec: expected a NeuronSpec"):
        check_spec(42, dtypes="float64")  # type: ignore[arg-type]


def test_check_spec_takes_one_dtype_by_name_not_its_letters() -> None:
    report = check_spec("lif", dtypes="float64", resets="hard", detach=False, examples=1)
    assert [case.label.split()[:3] for case in report.cases] == [["lif", "float64", "hard"]] and report.passed


def default_path_dtypes(name: str, run: str = profile()) -> tuple[str, ...]:
    """The dtypes `test_kernels_without_state_sequences` checks a spec in through check_spec (its own reset, not
    detached): float32 and float16 with --slow and for REPRESENTATIVE_SPECS; by default one of them for each other
    spec, taken in turn (each in half the specs), on `default_path_setups` alone. `run`: the profile."""
    if run == "slow" or name in REPRESENTATIVE_SPECS:
        return ("float32", "float16")
    return (("float32", "float16")[SPECS.index(name) % 2],)


def default_path_examples() -> tuple[tuple[int, int], ...]:
    """The shapes of `default_path_setups`' examples: the property's T (one kernel replaying T steps for both), no
    T = 1 (its own kernels, replaying one step: these specs run it in the property's float64 setup, and
    REPRESENTATIVE_SPECS on this path too); N = 1 and check_spec's largest N (three blocks of threads, the
    property's largest, is a matter of the launch, not of the path: the same kernels)."""
    steps = EXAMPLES[1][0]
    return ((steps, 1), (steps, 33))


@pytest.mark.parametrize("name", SPECS)
def test_kernels_without_state_sequences(name: str) -> None:
    """FPTT writing only h (and saved states), BPTT without state-sequence gradients: what ops use by default.
    Through check_spec (three drawn cases, the first with T = 1) with --slow and for REPRESENTATIVE_SPECS; the other
    specs on `default_path_setups` (in both profiles), whose kernels the module fixture compiles."""
    if profile() == "slow" or name in REPRESENTATIVE_SPECS:
        check_spec(name, dtypes=default_path_dtypes(name), resets=spec_resets(name)[:1], detach=(False,),
                   examples=3, store_state_seq=False, raise_on_failure=True)
    for setup in (setup for setup in default_path_setups() if setup.spec.name == name):
        for shape in default_path_examples():
            report = check_case(make_case(setup, shape, seed=2 + default_path_examples().index(shape)))
            assert report.passed, report.describe()


def test_the_default_path_setups_cover_every_spec_and_share_the_single_step_kernels() -> None:
    """What the default profile keeps of the full default-path check (check_spec at T = 1 and a drawn T, float32
    and float16, for every spec): every spec on the default path; float32 and float16 each in half the specs or
    more; REPRESENTATIVE_SPECS through check_spec in both (T = 1 included); the others at T > 1, each in a setup of
    the property (the same single-step kernels), whose T = 1 kernels run in its float64 setup. With --slow
    check_spec runs every spec in both dtypes besides."""
    setups = default_path_setups()
    checked = {(setup.spec.name, setup.dtype) for setup in setups}
    checked |= {(name, dtype) for name in REPRESENTATIVE_SPECS for dtype in default_path_dtypes(name)}
    assert {name for name, _ in checked} == set(SPECS)
    for dtype in ("float32", "float16"):
        assert 2 * sum(1 for _, d in checked if d == dtype) >= len(SPECS) - 1, dtype
    assert all(default_path_dtypes(name) == ("float32", "float16") for name in REPRESENTATIVE_SPECS)
    assert all(shape[0] > 1 for shape in default_path_examples())
    default = default_setups()
    for setup in setups:
        assert (setup.spec.name, setup.dtype, setup.reset, setup.detach_reset) in default, setup.label
        single_step = {k.kernel_name for k in _kernels(setup)[-2:]}
        assert single_step == {k.kernel_name for k in _kernels(dataclasses.replace(setup, store_state_seq=True))[-2:]}
    for name in SPECS:
        assert any(key[0] == name and EXAMPLES[0] in examples_of(key) for key in CHOSEN), name
        # the single step: in the spec's float64 setup of the property, and (spec outside REPRESENTATIVE_SPECS) on
        # its default-path setup here
        assert any(key[:2] == (name, "float64") and single_step_checked(key) for key in CHOSEN), name


def test_shared_learnable_parameter() -> None:
    """One w for all neurons: the kernel's per-neuron partial sums add up to the reference's gradient."""
    report = check_spec("parametric_lif", dtypes=DTYPES[:2], resets=RESETS, detach=(False,), examples=3,
                        per_neuron=False, raise_on_failure=True)
    assert len(report.cases) == 12


@pytest.mark.parametrize("name, dtype, layout", FORCED_LAYOUTS, ids=lambda v: str(v))
def test_forced_layouts(name: str, dtype: str, layout: dict) -> None:
    check_spec(name, dtypes=(dtype,), resets=("hard",), detach=(False,), examples=3, layout=layout,
               raise_on_failure=True)


def test_user_spec_with_three_states_and_adaptive_threshold() -> None:
    report = check_spec(USER_SPEC, dtypes=("float64", "float32"), resets=RESETS, detach=(False,), examples=3,
                        raise_on_failure=True)
    assert len(report.cases) == 12
    assert any(case.ambiguous == 0 and case.neurons > 1 for case in report.cases)


def test_inputs_make_neurons_fire_and_rest() -> None:
    """The calibrated inputs exercise both branches of the spike (otherwise half the kernel goes untested)."""
    for name in (n for n in SPECS if load_spec(n).output == "s"):  # a non-spiking spec's spike is never read
        for reset in spec_resets(name):
            case = make_case(Setup(load_spec(name), reset=reset), (8, 33), seed=3)
            config = case.setup.config()
            system = config.derivation().system
            params = {p: case.params[p.name] for p in system.params}
            initial = [case.multi.initial[s.name] for s in case.setup.spec.states]
            spikes, _, _ = reference.multi_step(system, case.multi.all_x, initial, params, config.surrogate)
            rate = float((spikes != 0).double().mean())  # a multi-level spike: any level
            assert 0.05 < rate < 0.9, (name, reset, rate)


def test_the_default_setups_hold_every_pair_of_the_full_product() -> None:
    """Each (spec, dtype), (spec, reset, detach_reset) and (dtype, reset, detach_reset) of the full product is in
    the default profile's setups, and each reset rule of a spec is checked in a tight dtype and in a half one."""
    default = default_setups()
    for pick in (lambda k: (k[0], k[1]), lambda k: (k[0], k[2], k[3]), lambda k: k[1:]):
        assert {pick(k) for k in FULL} == {pick(k) for k in default}
    for name in SPECS:
        for reset in spec_resets(name):
            dtypes = {k[1] for k in default if k[0] == name and k[2] == reset}
            assert dtypes & {"float64", "float32"} and dtypes & {"float16", "bfloat16"}, (name, reset, dtypes)
