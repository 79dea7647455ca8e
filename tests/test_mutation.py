"""Broken kernels fail the check (issue 5): the host property tests would catch them.

Each mutation is an exact text replacement in one generated kernel, asserted to occur exactly once (so a change
in the code generator cannot make this file pass vacuously). The mutated source runs through autocuda.toolchain.host
with the original kernel's parameter list, in place of that kernel, under `autocuda.testing.check_case`; the same
cases must pass with the unmutated kernels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import pytest
from conftest import compile_launched

from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.runtime.records import KernelRecord
from autocuda.spec.load import load_spec
from autocuda.tools.testing import Report, Setup, check_case, make_case

# Several steps (the reverse loop matters) and several neurons (per-neuron values); one T, so that both shapes run
# the same kernels (a T below a replay segment compiles kernels replaying T steps, a pair per T).
SHAPES = ((6, 9), (6, 5))


class Mutant(KernelRecord):
    """A generated kernel with one replacement in its source. Every launch path (host, CUDA, packed or not)
    reads `full_codes`, so `uses` counts that the mutated text, not the original, was compiled and run."""

    def __init__(self, kernel: KernelRecord, old: str, new: str, times: int = 1):
        source = kernel.full_codes
        assert source.count(old) == times, (f"{kernel.kernel_name}: {old!r} occurs {source.count(old)} times, "
                                            f"expected {times}")
        self.uses = 0
        super().__init__(kernel.kernel_name, source.replace(old, new), tuple(kernel.cparams.values()), kernel.lanes,
                         kernel.block, kernel.checkpoint_steps)

    @property
    def full_codes(self) -> str:
        self.uses += 1
        return self.mutated

    @full_codes.setter
    def full_codes(self, value: str) -> None:
        self.mutated = value


@dataclasses.dataclass(frozen=True)
class MutatedConfig(NeuronConfig):
    """A NeuronConfig whose `target` kernel is replaced by a Mutant; `made` keeps the mutants for inspection."""

    target: str = ""
    old: str = ""
    new: str = ""
    times: int = 1
    made: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def kernel(self, kind: str, dtype: Any, **options: Any) -> Any:
        kernel = super().kernel(kind, dtype, **options)
        if kind != self.target:
            return kernel
        self.made.append(Mutant(kernel, self.old, self.new, self.times))
        return self.made[-1]


def negate_assignment(source: str, target: str) -> tuple[str, str]:
    """(old, new) turning the unique statement `target = EXPR;` into `target = -(EXPR);`."""
    lines = [line for line in source.splitlines() if line.strip().startswith(f"{target} = ")]
    assert len(lines) == 1, f"{target} is assigned {len(lines)} times"
    expression = lines[0].split(" = ", 1)[1].rstrip(";")
    return lines[0], lines[0].replace(f"= {expression};", f"= -({expression});")


class Mutation(NamedTuple):
    spec: str
    dtype: str
    reset: str
    kernel: str
    old: str
    new: str
    fails: str          # a comparison that must fail, e.g. "bptt grad_x_seq"
    times: int = 1      # occurrences of `old` (a replayed segment is rendered twice: the short one, the full ones)
    layout: tuple = ()  # kernel layout options, as `Setup.layout`


STAGED = (("lanes", 1), ("staged", 2), ("vector", True))

MUTATIONS = {
    "grad_x sign flipped": Mutation("lif", "float32", "hard", "bptt", "ac_out_grad_x[lane]", "", "bptt grad_x_seq"),
    "step grad_x sign flipped": Mutation("alif", "float32", "hard", "step-backward", "ac_out_grad_x[lane]", "",
                                         "step-backward grad_x_seq"),
    "reverse loop stops at t = 1": Mutation("qif", "float32", "hard", "bptt", "t = T - 1; t >= 0;",
                                            "t = T - 1; t >= 1;", "bptt grad_v_init"),
    "reverse loop stops at t = 1 (bfloat16)": Mutation("eif", "bfloat16", "soft", "bptt", "t = T - 1; t >= 0;",
                                                       "t = T - 1; t >= 1;", "bptt grad_v_init"),
    "h[t-1] read as h[t]": Mutation("qif", "float64", "soft", "bptt", "h_seq[ac_row - N + lane]",
                                    "h_seq[ac_row + lane]", "bptt grad_x_seq"),
    "h[t-1] read as h[t] (float16)": Mutation("izhikevich", "float16", "hard", "bptt", "h_seq[ac_row - N + lane]",
                                              "h_seq[ac_row + lane]", "bptt grad_x_seq"),
    "replay without the spike's jump (float16)": Mutation("alif", "float16", "soft", "bptt",
                                                          "const float ac_next_usr_a = (ac_s + (usr_a[lane] * ac_k1));",
                                                          "const float ac_next_usr_a = (usr_a[lane] * ac_k1);",
                                                          "bptt grad_x_seq", 2),
    "replay without the spike's jump": Mutation("alif", "float32", "soft", "bptt",
                                                "const float ac_next_usr_a = (ac_s + (usr_a[lane] * ac_k1));",
                                                "const float ac_next_usr_a = (usr_a[lane] * ac_k1);", "bptt grad_x_seq",
                                                2),
    "hard reset to v_reset + 0.25": Mutation("lif", "float32", "hard", "fptt", "(ac_s * usr_v_reset)",
                                             "(ac_s * (usr_v_reset + 0.25f))", "fptt v_seq"),
    "soft reset by half the threshold": Mutation("lif", "float64", "soft", "fptt", "(ac_h - (ac_s * ac_thr))",
                                                 "(ac_h - (ac_s * (0.5 * ac_thr)))", "fptt v_seq"),
    "surrogate alpha 3 instead of 4": Mutation("izhikevich", "float64", "hard", "bptt", "const double ac_sg = ((4.0 *",
                                               "const double ac_sg = ((3.0 *", "bptt grad_x_seq"),
    "learnable gradient subtracted": Mutation("parametric_lif", "float32", "hard", "bptt",
                                              "ac_acc_usr_w[lane] = (ac_acc_usr_w[lane] + ",
                                              "ac_acc_usr_w[lane] = (ac_acc_usr_w[lane] - ", "bptt grad_w"),
    "per-neuron parameter read as shared": Mutation("parametric_lif", "float32", "soft", "fptt", "usr_w[ac_n0 + lane]",
                                                    "usr_w[0]", "fptt h_seq"),
    # inputs staged in registers two steps per block: a block that never moves up replays the first one's inputs
    "staged blocks never move up": Mutation("lif", "float32", "hard", "bptt",
                                            "ac_staged_ac_h_cur[ac_b][ac_d] = ac_staged_ac_h_cur[ac_b + 1][ac_d];",
                                            "/* not moved */",
                                            "bptt grad_x_seq", layout=STAGED),
    "staged input read a step late": Mutation("qif", "float64", "soft", "fptt", "&ac_staged_x[0][ac_d]",
                                              "&ac_staged_x[(ac_d + 1) / 2][(ac_d + 1) % 2]", "fptt v_seq",
                                              layout=STAGED),
}


def _setup(m: Mutation) -> Setup:
    return Setup(load_spec(m.spec), m.dtype, m.reset, layout=m.layout)


def _mutated(m: Mutation) -> MutatedConfig:
    config = _setup(m).config()
    old, new = m.old, m.new
    if not new:  # a sign flip of the whole assignment to `old`
        old, new = negate_assignment(config.kernel(m.kernel, m.dtype).full_codes, m.old)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(NeuronConfig)
              if f.init and not f.name.startswith("_")}   # not the kernel cache: the mutant must not leak into it
    return MutatedConfig(**fields, target=m.kernel, old=old, new=new, times=m.times)


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels the mutations' cases launch, the unmutated then the mutated ones (a mutant has its original's
    name: two sets of kernels), compiled up front many to a compiler run (`conftest.compile_launched`)."""
    def run(m: Mutation, mutated: bool) -> None:
        for i, shape in enumerate(SHAPES):
            check_case(make_case(_setup(m), shape, seed=100 + i), config=_mutated(m) if mutated else None)

    return sum(compile_launched(*(functools.partial(run, m, mutated) for m in MUTATIONS.values()))
               for mutated in (False, True))


@pytest.mark.parametrize("label", MUTATIONS)
def test_mutation_is_detected(label: str) -> None:
    m = MUTATIONS[label]
    setup, mutated = _setup(m), _mutated(m)
    reports = []
    for i, shape in enumerate(SHAPES):
        case = make_case(setup, shape, seed=100 + i)
        assert check_case(case).passed, f"unmutated kernels must pass: {check_case(case).describe()}"
        reports.append(check_case(case, config=mutated))
    assert mutated.made and all(mutant.uses for mutant in mutated.made), "the mutant was never launched"
    failed = {c.name for r in reports for c in r.comparisons if not c.passed}
    assert m.fails in failed, f"{label}: expected {m.fails} to fail; failed: {sorted(failed)}"
    with pytest.raises(AssertionError, match=m.fails):
        Report(reports).raise_on_failure()


def test_mutations_are_exact() -> None:
    """A replacement text that is not in the source is refused rather than ignored."""
    m = MUTATIONS["reverse loop stops at t = 1"]
    with pytest.raises(AssertionError, match="occurs 0 times"):
        Mutant(_setup(m).config().kernel("bptt", "float32"), "t = T - 1; t >= 7;", "t = T - 1; t >= 1;")
