"""User-chosen names in generated C: spelled behind a prefix, never trusted to a list of C names.

1. Names that are C++ alternative operator tokens, macros of the headers the kernels see (the C library's, CUDA's)
   and the host shim's own macros: each is refused with a SpecError naming its field, or accepted in every role
   (state, learnable and scalar parameter, derived quantity, option; some as the membrane), and then the kernels
   hold it only as spelled (`cnames.c_name`), compile with nvcc and run on the host runner as the reference does.
2. A long spec name (kernel names are made from it) works end to end: `autocuda new`, `autocuda show`, a run.
3. A planted `specs/` cache entry spares the parse only, never the name and structure checks.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from conftest import compile_checked, compile_together, profile

from autocuda.base.errors import SpecError
from autocuda.codegen.kernels import neuron_kernel
from autocuda.codegen.neuron_kernel import KERNEL_STEM
from autocuda.spec.load import load_spec
from autocuda.spec.model import NeuronSpec, spec_text
from autocuda.spec.names import LANGUAGE_NAMES, MAX_SPEC_NAME
from autocuda.toolchain import store
from autocuda.toolchain.cnames import USER_PREFIX, c_name
from autocuda.toolchain.host import cxx as toolchain
from autocuda.toolchain.host.runner import SHIM
from autocuda.tools.cli import main
from autocuda.tools.testing import Report, check_spec

ALTERNATIVE_TOKENS = ["xor", "bitand", "bitor", "compl", "not_eq", "and_eq", "or_eq", "xor_eq"]
HEADER_MACROS = ["M_LN2", "MAXFLOAT", "RAND_MAX", "INT_MAX", "CHAR_BIT", "FP_NAN", "HUGE_VALF", "M_SQRT2", "CUDARTAPI",
                 "CUDART_ONE_FP16"]
SHIM_MACROS = re.findall(r"^\s*#\s*define\s+(\w+)", SHIM, re.M)
# More names the kernels, their headers or the prefix itself could meet.
OTHERS = ["int", "float", "half2", "threadIdx", "memcpy", "lane", "t", "main", "std", "NULL", "INFINITY", "asm",
          "volatile", "AC_ASYNC_COPY", "usr_v", "dt", "N", "x_seq", "ac_h", "lambda"]
NAMES = list(dict.fromkeys(ALTERNATIVE_TOKENS + HEADER_MACROS + SHIM_MACROS + OTHERS))
ROLES = {"membrane": "states", "state": "states", "learnable": "params", "scalar": "params", "derived": "derived",
         "option": "options"}
PLAIN = {"membrane": "v", "state": "w", "learnable": "g", "scalar": "k", "derived": "d", "option": "o"}
P = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}


HOST_MISSING = toolchain.missing()
needs_host = pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")


def spec_of(roles: Mapping[str, Sequence[str]], name: str = "named") -> NeuronSpec:
    """A neuron using each role's names (one membrane, any number of the others), every one of them in the step."""
    m, = roles["membrane"]
    ws, gs, ks, ds, os_ = (roles[r] for r in ("state", "learnable", "scalar", "derived", "option"))
    terms = [f"0.05 * {w} * {w}" for w in ws] + [f"0.02 * {m} * {p}" for p in (*gs, *ks)]
    terms += [f"0.01 * {d}" for d in ds] + [f"(0.01 if {o} else -0.01)" for o in os_]
    return NeuronSpec(name=name, params={**P, **{g: {"default": 0.3, "learnable": True} for g in gs},
                                         **{k: 0.2 for k in ks}},
                      states={m: "v_reset", **{w: 0.0 for w in ws}},
                      charge=" + ".join([f"{m} + (x - {m}) / tau", *terms]),
                      updates={w: f"{w} * 0.5 + 0.1 * s" for w in ws}, derived={d: "1 / tau" for d in ds},
                      options={o: i % 2 == 0 for i, o in enumerate(os_)})


def one_name(role: str, name: str) -> NeuronSpec:
    return spec_of({r: [name if r == role else plain] for r, plain in PLAIN.items()})


def verdict(name: str) -> bool:
    """Whether `name` is accepted: in every role alike, or refused in every role by the field declaring it."""
    accepted = []
    for role, group in ROLES.items():
        try:
            one_name(role, name)
        except SpecError as error:
            assert (error.field, error.symbol) == (f"{group}.{name}", name), f"{role} {name}: {error}"
            accepted.append(False)
        else:
            accepted.append(True)
    assert len(set(accepted)) == 1, f"{name!r} accepted in some roles only: {dict(zip(ROLES, accepted))}"
    return accepted[0]


@functools.cache
def accepted() -> tuple[str, ...]:
    return tuple(n for n in NAMES if verdict(n))


def test_every_name_is_refused_by_its_field_or_accepted_in_every_role():
    assert {"AC_HOST_EXPORT", "AUTOCUDA_HOST_SHIM_H", "__global__", "__syncthreads"} <= set(SHIM_MACROS)
    assert set(ALTERNATIVE_TOKENS + HEADER_MACROS) <= set(accepted()), "C names are no concern behind the prefix"
    refused = set(NAMES) - set(accepted())
    assert {"dt", "N", "x_seq", "ac_h", "lambda"} <= refused
    assert refused & set(SHIM_MACROS) == {n for n in SHIM_MACROS if "__" in n}


STATE_GROUPS = 3
SPECS = ["learnable", "scalar", "derived", "option", *(f"states{i}" for i in range(STATE_GROUPS))]


def role_spec(which: str) -> NeuronSpec:
    """Every accepted name in one role (`which`), or one group of them as states (the group's first name the
    membrane): over SPECS each name takes every role, the membrane's for some (it is spelled as the other states)."""
    roles: dict[str, list[str]] = {r: [] for r in PLAIN} | {"membrane": ["v"]}
    if which.startswith("states"):
        group = list(accepted()[int(which[len("states"):])::STATE_GROUPS])
        roles |= {"membrane": group[:1], "state": group[1:]}
    else:
        roles[which] = list(accepted())
    return spec_of(roles, f"named_{which}")


KERNELS = [("fptt", "float32", {"store_state_seq": True}), ("bptt", "float32", {"grad_state_seq": True}),
           ("fptt", "float16", {"lanes": 4, "vector": True, "staged": 4}), ("bptt", "bfloat16", {"prefetch": 3}),
           ("bptt", "float16", {"native": True, "lanes": 2}), ("step-backward", "float64", {"given_inits": False})]


def sources(spec: NeuronSpec) -> list[str]:
    tensors = [p.name for p in spec.params if p.learnable]
    return [neuron_kernel(spec, kind, dtype, per_neuron=tensors, **options).full_codes
            for kind, dtype, options in KERNELS]


def _code_tokens(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", "\n".join(line.split("//")[0] for line in source.splitlines())))


def test_names_reach_the_source_only_as_spelled():
    """No accepted name is a token of a kernel's code unless the generator writes that token anyway (`int`,
    `lane`, ...: tokens of shipped specs' kernels of the same kinds); parameters appear as `c_name` spells them."""
    own = set().union(*(_code_tokens(s) for spec in ("lif", "alif", "parametric_lif")
                        for s in sources(load_spec(spec))))
    for which in SPECS:
        code = "\n".join(sources(role_spec(which)))
        bare = (_code_tokens(code) & set(accepted())) - own
        assert not bare, f"{which}: user names in code: {sorted(bare)}"
        if which in ("learnable", "scalar"):
            assert all(c_name(n) in code for n in accepted()), which


# The names are spelled behind the prefix whatever the architecture: by default one (as the zoo's and the fuzzers'
# nvcc checks), to PTX (what a name can break, the front end decides: no user name reaches ptxas, see `nvcc_check`;
# ptxas's verdict on these kernels' shapes is test_neuron_compile's); with --slow every architecture nvcc checks
# (CHECK_ARCHS), assembled.
NAME_ARCHS = None if profile() == "slow" else ("sm_80",)


def test_kernels_with_these_names_compile_with_nvcc(nvcc):
    units = {which: "\n".join(sources(role_spec(which))) for which in SPECS}
    assert compile_together(nvcc, units, archs=NAME_ARCHS, assemble=profile() == "slow") == {}


def test_no_user_name_reaches_ptx(nvcc, tmp_path):
    """What the default check above leaves out, ptxas, reads PTX: the user's names are not in it (a kernel holding
    a third of them as its states)."""
    from autocuda.toolchain.compile import nvcc_path, unoptimised_flags

    unit = tmp_path / "names.cu"
    unit.write_text(sources(role_spec("states0"))[0])
    subprocess.run([nvcc_path(), "-std=c++17", *unoptimised_flags(nvcc_path()), "--ptx", "-arch=compute_80", "-o",
                    str(tmp_path / "names.ptx"), str(unit)], check=True, capture_output=True)
    ptx = (tmp_path / "names.ptx").read_text()
    assert ".entry named_states0_" in ptx
    assert not re.findall(rf"\b{USER_PREFIX}\w+", ptx)


def checks(which: str) -> list[Callable[[], Report]]:
    """The host checks of one role's spec: every role's plain run, and for states0 its inputs staged in registers
    named after the states."""
    spec = role_spec(which)
    found = [functools.partial(check_spec, spec, "host", dtypes=("float32",), resets=("hard",), detach=(False,),
                               examples=2, max_steps=6, max_neurons=9)]
    if which == "states0":
        found.append(functools.partial(check_spec, spec, "host", dtypes=("float32",), resets=("hard",),
                                       detach=(False,), examples=1, layout={"lanes": 2, "vector": True, "staged": 2},
                                       max_steps=6, max_neurons=8))
    return found


@pytest.fixture(scope="module")
def checked_kernels() -> int:
    """The host kernels of every role's checks, compiled up front many to a compiler run (`conftest.compile_checked`):
    each check would compile its own in a run of its own."""
    return compile_checked(*(check for which in SPECS for check in checks(which)))


@needs_host
@pytest.mark.parametrize("which", SPECS)
def test_kernels_with_these_names_run_as_the_reference(which, checked_kernels):
    for check in checks(which):
        report = check()
        assert report.passed, report.summary()


def test_spellings_are_distinct_and_prefixed():
    roles = ("", "grad", "grad_prev", "next", "acc", "init", "hist", "param", "staged", "ring")
    spelled = [c_name(n, r) for n in ("v", "grad_v", "v_next", "usr_v", "ac_v") for r in roles]
    assert len(set(spelled)) == len(spelled)
    assert c_name("v") == f"{USER_PREFIX}v" and c_name("v", "grad") == f"ac_grad_{USER_PREFIX}v"
    with pytest.raises(ValueError, match="usr"):
        c_name("v", "usr")


def test_the_language_names_match_the_parser():
    from autocuda.spec.parse import CONSTANTS, DRAW_FUNCTIONS, FUNCTIONS, RESERVED_NAMES

    assert LANGUAGE_NAMES == set(FUNCTIONS) | set(CONSTANTS) | set(DRAW_FUNCTIONS) == RESERVED_NAMES


# -- 2. long spec names ---------------------------------------------------------------------------------------------
LONG = ("a_long_spec_name_" * 4)[:59] + "x"


@needs_host
def test_a_long_spec_name_works_end_to_end(tmp_path: Path, capsys):
    assert len(LONG) == 60
    assert main(["new", str(tmp_path / LONG)]) == 0
    assert main(["show", str(tmp_path / f"{LONG}.toml"), "--kernel", "bptt", "--dtype", "bfloat16"]) == 0
    kernel = re.search(r"__global__ void (\w+)\(", capsys.readouterr().out).group(1)
    assert kernel.startswith(LONG[:KERNEL_STEM - 7].rstrip("_")) and len(kernel) <= 63, kernel
    spec = load_spec(tmp_path / f"{LONG}.toml")
    assert spec.name == LONG
    report = check_spec(spec, "host", dtypes=("float32",), resets=("hard",), detach=(False,), examples=1)
    assert report.passed, report.summary()


def test_long_spec_names_name_their_kernels_apart():
    first, second = (dataclasses.replace(load_spec("lif"), name=LONG[:-1] + end) for end in "xy")
    names = [neuron_kernel(spec, "bptt", "bfloat16", detach_reset=True).kernel_name for spec in (first, second)]
    assert names[0] != names[1] and all(len(n) <= 63 for n in names), names
    assert neuron_kernel(load_spec("lif"), "fptt").kernel_name.startswith("lif_fptt_float32_")


@pytest.mark.parametrize("name", ["a" * (MAX_SPEC_NAME + 1), "lif_", "a__b", "ac_lif", "2fast", "a-b"])
def test_bad_spec_names_are_refused_by_field(name, tmp_path: Path, capsys):
    with pytest.raises(SpecError) as info:
        dataclasses.replace(load_spec("lif"), name=name)
    assert info.value.field == "name"
    assert main(["new", str(tmp_path / name)]) == 2  # `autocuda new` refuses what `show` would
    assert not (tmp_path / f"{name}.toml").exists() and name in capsys.readouterr().err


# -- 3. the disk entry of a valid spec ------------------------------------------------------------------------------
PAYLOADS = ['a;system("x")', 'v) { std::system("id"); } //', "x\n#include <cstdlib>", "__global__", "w" * 65]


def _unchecked(fields: Mapping[str, object]) -> NeuronSpec:
    """A NeuronSpec as construction normalises it, never validated: what its disk entry is keyed by."""
    spec = object.__new__(NeuronSpec)
    for f in dataclasses.fields(NeuronSpec):
        object.__setattr__(spec, f.name, fields.get(f.name, f.default))
    spec._normalise()
    return spec


def _plant(fields: Mapping[str, object]) -> None:
    store.save("specs", store.key(f"valid spec {spec_text(_unchecked(fields))}"), b"valid")


def _with_name(group: str, name: str) -> dict[str, object]:
    fields: dict[str, object] = {"name": "planted", "params": P, "states": {"v": "v_reset"}, "charge": "v + x / tau"}
    if group == "params":
        fields["params"] = {**P, name: 1.0}
    elif group == "states":
        fields |= {"states": {"v": "v_reset", name: 0.0}, "updates": {name: "v"}}
    else:
        fields["name"] = name
    return fields


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("group", ["params", "states", "name"])
def test_a_planted_specs_entry_does_not_skip_validation(payload, group, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    fields = _with_name(group, payload)
    _plant(fields)
    with pytest.raises(SpecError) as info:
        NeuronSpec(**fields)
    assert info.value.field == (f"{group}.{payload}" if group != "name" else "name")


@pytest.mark.parametrize("group", ["params", "states", "name"])
def test_a_known_spec_is_checked_but_not_parsed_again(group, tmp_path: Path, monkeypatch):
    """The entry spares the parse (sympy) alone; a planted one is found (the key is computed as above)."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    fields = _with_name(group, "int")  # a fine name, behind the prefix
    _plant(fields)
    spec = NeuronSpec(**fields)
    assert "_parsed" not in spec.__dict__ and spec.parsed().charge is not None
    fields["name"] = "unplanted"
    assert "_parsed" in NeuronSpec(**fields).__dict__
