"""The disk cache of kernel records and specs: what a warm process reads instead of deriving with sympy."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import python_children
import torch

from autocuda.codegen.kernels import neuron_kernel
from autocuda.runtime.configs import get_config
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.runtime.records import KernelRecord, kernel_record
from autocuda.spec.load import load_spec
from autocuda.toolchain import store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    return tmp_path


def _config(name: str = "izhikevich") -> NeuronConfig:
    spec = load_spec(name)
    return NeuronConfig(spec, spec.surrogate, spec.reset)


def test_a_record_is_the_generated_kernel(cache_root):
    options = {"store_state_seq": True, "save_for_backward": True, "lanes": 2, "vector": True}
    fresh = _config().kernel("fptt", "float16", **options)
    stored = _config().kernel("fptt", "float16", **options)  # a new config object: read back from disk
    spec = load_spec("izhikevich")
    built = neuron_kernel(spec, "fptt", "float16", **options)
    for record in (fresh, stored):
        assert record.full_codes == built.full_codes and record.kernel_name == built.kernel_name
        assert list(record.cparams.values()) == list(built.cparams.values()) and record.lanes == 2
    assert len(list((cache_root / "kernels").glob("*.sha256"))) == 1


def test_damaged_or_foreign_records_are_rebuilt(cache_root):
    calls = []

    def build():
        calls.append(1)
        return neuron_kernel(load_spec("lif"), "bptt", "float32")

    first = kernel_record("probe", build)
    (entry,) = [p for p in (cache_root / "kernels").iterdir() if not p.name.endswith(".sha256")]
    entry.write_bytes(entry.read_bytes()[:-10])  # truncated: fails its checksum
    assert kernel_record("probe", build).full_codes == first.full_codes and len(calls) == 2
    store.write(entry, json.dumps({"name": "k"}).encode())  # checksum fine, fields missing
    assert kernel_record("probe", build).full_codes == first.full_codes and len(calls) == 3
    assert kernel_record("probe", build).full_codes == first.full_codes and len(calls) == 3


def test_record_names_change_with_the_generator_code(monkeypatch):
    before = store.key("same text")
    monkeypatch.setattr(store, "code_fingerprint", lambda: "another generator")
    assert store.key("same text") != before


def test_a_bad_spec_is_refused_every_time(cache_root):
    from autocuda.base.errors import SpecError
    from autocuda.spec.load import spec_from_toml

    text = 'name = "bad"\nreset = "soft"\nstates = { v = 0.0 }\ncharge = "v + x + nope"\n'
    for _ in range(2):  # nothing about an invalid spec is remembered
        with pytest.raises(SpecError, match="nope"):
            spec_from_toml(text)


WARM = textwrap.dedent("""
    import json, os, subprocess, sys, torch
    from autocuda.call.functional import multi_step

    def run():
        x = (torch.randn(4, 8, dtype=torch.float64) * 2 + 0.5).requires_grad_(True)
        s, (v, w), _ = multi_step("izhikevich", x, backend="host", a=0.1)
        torch.autograd.grad((s.sum() + v.sum() + w.sum()), x)
        return {"sympy": "sympy" in sys.modules, "cupy": "cupy" in sys.modules, "spike_sum": float(s.sum())}

    if sys.argv[1:] == ["cold"]:
        print(json.dumps(run()))
    elif hasattr(os, "fork"):  # the cold run in a fork of this process, taken before it runs anything
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            try:
                with os.fdopen(writer, "w") as out:
                    out.write(json.dumps(run()))
            except BaseException:
                import traceback
                traceback.print_exc()  # into the stderr the test shows
            finally:
                os._exit(0)
        os.close(writer)
        with os.fdopen(reader) as result:
            cold = json.loads(result.read() or "null")
        os.waitpid(pid, 0)
        print(json.dumps({"cold": cold, "warm": run()}))
    else:  # the cold run in a process of its own
        done = subprocess.run([sys.executable, __file__, "cold"], capture_output=True, text=True)
        cold = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
        print(json.dumps({"cold": cold, "warm": run()}))
""")


def test_a_process_with_a_warm_cache_imports_no_sympy(tmp_path):
    """A new process (`python_children`: torch imported, nothing of ours) that finds the kernels on disk does not
    import sympy. The cold run that derives them and writes them into the cache runs in a fork of that process taken
    before it runs anything (where the system can fork): fresh but for the imports, which it shares with the warm
    run (which cannot see what the fork did in its memory, only the cache it wrote)."""
    # AUTOCUDA_NATIVE=0: with a fresh cache, each process would leave a helper building the native library after it
    # ends, which no test uses, and a build that finished in time would change the path midway
    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), "AUTOCUDA_NATIVE": "0"}
    script = tmp_path / "warm.py"
    script.write_text(WARM)
    done = python_children.run([str(script)], env=env)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    cold, warm = runs["cold"], runs["warm"]
    assert cold is not None, done.stderr
    assert cold["sympy"] and not warm["sympy"] and not warm["cupy"]


def test_plans_need_no_derivation():
    """Building a kernel plan reads facts of the spec only: its derivation happens when a kernel is made."""
    plan = get_config("lif", reset="soft")
    assert plan.scalars == ("tau", "v_threshold") and plan.state_names == ("v",)
    with pytest.raises(Exception, match="reset must be one of"):
        get_config("lif", reset="sideways")


def test_records_survive_json():
    record = KernelRecord.of(neuron_kernel(load_spec("lif"), "fptt", torch.float32, given_inits=False))
    again = KernelRecord.from_json(record.to_json())
    assert (again.kernel_name, again.full_codes, again.lanes, again.block) == (record.kernel_name, record.full_codes,
                                                                             record.lanes, record.block)
    assert again.cparams == record.cparams


def test_long_loop_candidates_fit_the_dtype_and_the_neurons():
    from autocuda.runtime import tuning

    def lanes(layouts):  # (neurons per thread, steps in the shared ring, steps per block staged in registers)
        return sorted({(layout["lanes"], layout["prefetch"], layout.get("staged", 0)) for layout in layouts})

    always = lambda width: True  # noqa: E731
    staged = [(1, 0, 32), (2, 0, 16), (2, 0, 32)]  # one 4-byte word per step at least
    assert lanes(tuning.candidates(16384, torch.float32, always)) == sorted(
        [(0, 0, 0), (0, 32, 0), (2, 0, 0), (2, 32, 0), (4, 0, 0), *staged])
    assert lanes(tuning.candidates(16384, torch.bfloat16, always)) == [(1, 32, 0), (2, 0, 0), (2, 0, 16), (2, 0, 32),
                                                                      (2, 32, 0), (4, 0, 0)]
    assert lanes(tuning.candidates(16383, torch.bfloat16, always)) == [(0, 0, 0)], "odd N: no pairs, no vectors"
    assert lanes(tuning.candidates(16384, torch.float64, always)) == sorted(
        [(0, 0, 0), (0, 32, 0), (2, 0, 0), (2, 32, 0), *staged]), "no 32-byte vectors"
    assert lanes(tuning.candidates(16385, torch.float32, always)) == [(0, 0, 0), (0, 32, 0), (1, 0, 32)], \
        "odd N: one per thread"
    assert lanes(tuning.candidates(16384, torch.float32, lambda width: width <= 8)) == sorted(
        [(0, 0, 0), (0, 32, 0), (2, 0, 0), (2, 32, 0), *staged])
    assert all(c["vector"] for c in tuning.candidates(16385, torch.float32, always) if c.get("staged"))
    assert {c["block"] for c in tuning.candidates(16384, torch.float32, always) if c["prefetch"]} == {64}
    assert all(c["unroll"] == tuning.UNROLL for c in tuning.candidates(64, torch.float16, always))


def test_short_loop_candidates_are_access_widths_that_fit():
    from autocuda.runtime import tuning

    def lanes(n, dtype, aligned=lambda width: True):
        layouts = tuning.candidates(n, dtype, aligned, long=False)
        assert all(c["vector"] == (c["lanes"] > 1) for c in layouts)
        widths = [c["lanes"] for c in layouts if c["unroll"] == tuning.SHORT_UNROLL]
        if widths != [0]:  # every width unrolled twice and four times, but odd N's single fallback
            assert [(c["lanes"], c["unroll"]) for c in layouts] == [(w, u) for w in widths for u in (2, 4)]
        return widths

    assert lanes(1 << 20, torch.float32) == [0, 2, 4]
    assert lanes(1 << 20, torch.bfloat16) == [2, 4, 8]
    assert lanes(1 << 20, torch.float64) == [0, 2]
    assert lanes((1 << 20) + 2, torch.float32) == [0, 2], "N a multiple of two, not of four"
    assert lanes((1 << 20) + 1, torch.float16) == [0], "odd N: one element per thread"
    assert tuning.candidates((1 << 20) + 1, torch.float16, lambda width: True, long=False) == [
        {"lanes": 0, "vector": False, "unroll": tuning.SHORT_UNROLL}]
    assert lanes(1 << 20, torch.float32, lambda width: width <= 8) == [0, 2], "tensors aligned to 8 bytes only"


def test_short_loops_of_kernels_that_draw_also_try_small_blocks():
    from autocuda.runtime import tuning

    plain = tuning.candidates(1 << 20, torch.float32, lambda width: True, long=False)
    drawing = tuning.candidates(1 << 20, torch.float32, lambda width: True, long=False, draws=True)
    assert drawing == plain + [{**layout, "block": tuning.DRAWING_BLOCK} for layout in plain]
    assert all("block" not in layout for layout in plain)
    long = tuning.candidates(16384, torch.float32, lambda width: True)
    assert tuning.candidates(16384, torch.float32, lambda width: True, draws=True) == long, "long loops: as before"
