"""The benchmark's logic on the CPU: tiny shapes, one repetition; the JSON's structure, the table, the plot.

Timings here mean nothing (the CPU runs the torch reference); what is checked is that every part runs, the
eager step functions are the shipped specs, the floor arithmetic, and that failures become notes. The quick run
takes every workload: the default ones and the zoo (whose eager step is the spec through the reference), by default
in one dtype (the other runs take the other), with --slow in both."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import profile

from autocuda.call.functional import multi_step
from autocuda.spec.load import load_spec
from autocuda.spec.surrogate import Sigmoid
from autocuda.tools import cli
from bench import measure, report, suite, systems, workloads  # the repository's root is on the path (pyproject)

ROOT = Path(__file__).resolve().parents[1]

SHAPE = (4, 32)
# The quick run of every workload: by default in bfloat16 alone, the dtype of no other run here (the suite's other
# runs below are float32: together both dtypes), with --slow in both.
DTYPES = ("float32", "bfloat16") if profile() == "slow" else ("bfloat16",)
OTHER_RUNS_DTYPE = "float32"
RUN = (*workloads.CORE, *workloads.ZOO)  # --workloads all


# Rounds of the host part's timed calls in the quick run (the benchmark's own: measure.HOST_ROUNDS): the rows and
# their median are what is checked here, and each round is twenty calls of the torch reference on the CPU.
QUICK_HOST_ROUNDS = 2


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "HOST_ROUNDS", QUICK_HOST_ROUNDS)
        code = suite.main(["--device", "cpu", "--quick", "--shapes", f"{SHAPE[0]}x{SHAPE[1]}", "--dtypes",
                           ",".join(DTYPES), "--workloads", "all", "--parts", "speed,memory,host", "--out", str(out)])
    return code, out


def without_plot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's runs in the test draw no plot.png (matplotlib's layout and PNG take seconds a plot): for tests
    of other parts of a run. The quick run's plot holds every workload (test_quick_run_plots), and
    test_modes_option_measures_only_the_modes_named draws one whose training panels have no data."""
    monkeypatch.setattr(report, "plot", lambda results, path: "not drawn in this test")


def test_the_default_suite_runs_take_float32_and_bfloat16() -> None:
    assert {*DTYPES, OTHER_RUNS_DTYPE} == {"float32", "bfloat16"}


def test_quick_run_writes_results(quick_run: tuple[int, Path]) -> None:
    code, out = quick_run
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert {"date", "environment", "copy_bandwidth_GBps", "method", "workloads", "speed", "memory", "host",
            "elapsed_s"} <= results.keys()
    env = results["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["autocuda"]
    assert results["copy_bandwidth_GBps"] > 0
    rows = results["speed"]
    assert len(rows) == len(RUN) * len(DTYPES) * len(workloads.MODES)
    assert [r["spec"] for r in rows[::len(DTYPES) * 2]] == list(RUN)  # sorted by workload
    for r in rows:
        assert r["check"] == "ok", r
        assert r["check_figures"]["spike_agreement"] == 1.0 and 0 < r["check_figures"]["spike_rate"] < 1
        assert r["ours_ms"] > 0 and r["eager_ms"] > 0 and r["compile_ms"] is None
        zoo = r["spec"] in workloads.ZOO
        assert r["notes"]["compile"] == "skipped: --quick"
        if zoo:
            assert 0.05 <= r["check_figures"]["spike_rate"] <= 0.4, r  # the input keeps the zoo firing
            if workloads.WORKLOADS[r["spec"]].flexsn is None or systems.version("spikingjelly") is None:
                assert r["sj_ms"] is None and "sj" in r["notes"]
            else:  # SpikingJelly's FlexSN runs the model written as a Python core
                assert r["sj_ms"] > 0 and r.get("sj_check", "ok") == "ok", r
        element = torch.empty((), dtype=workloads.DTYPES[r["dtype"]]).element_size()
        nbytes = r["T"] * r["N"] * measure.ACCESSES[r["mode"]] * element
        assert r["floor_ms"] == pytest.approx(nbytes / (results["copy_bandwidth_GBps"] * 1e9) * 1e3)
        assert r["pct_floor"] == pytest.approx(100 * r["floor_ms"] / r["ours_ms"])
        if r["mode"] == "training":
            assert r["check_figures"]["grad_x_cosine"] > 0.999
    adex = [r for r in rows if r["spec"] == "adex"]
    assert all(r["sj_ms"] is None and "sj" in r["notes"] for r in adex)
    described = results["workloads"]
    assert list(described) == list(RUN) and described["cuba_lif"]["sj_function"] is None
    assert described["cuba_lif"]["eager_step"] == "SpecStep('cuba_lif')"
    assert described["lif"]["eager_step"] == "lif_step"
    assert results["memory"]["rows"] == [] and "needs a CUDA device" in results["memory"]["note"]
    host = {(r["system"], r["mode"], r["multithreaded_backward"]): r for r in results["host"]["rows"]}
    assert len(host) == len(results["host"]["rows"]) == 9  # three systems, three kinds of call
    assert all(host["ours", mode, threads]["us_per_call"] > 0 for mode, threads in measure.HOST_CALLS)
    timed = [row for row in host.values() if "us_per_call" in row]  # a peer's rows are skipped where it is missing
    assert all(len(row["us_per_call_rounds"]) == QUICK_HOST_ROUNDS for row in timed)


def test_quick_run_prints_table(quick_run: tuple[int, Path]) -> None:
    text = (quick_run[1] / "table.txt").read_text()
    assert "ours ms" in text and "% floor" in text and "×compile" in text and "copy bandwidth" in text
    assert "training, backward on the calling thread" in text
    assert "compile: skipped: --quick" in text and "ParametricLIF" in text
    assert "TwoCompartment" in text


def test_quick_run_plots(quick_run: tuple[int, Path]) -> None:
    pytest.importorskip("matplotlib")
    png = quick_run[1] / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_first_use_child_script(tmp_path: Path) -> None:
    """The child that the first-use part starts, run once here (the CPU runs the reference path). Its bytecode is
    the installed packages' own: under child_env's empty prefix the child would compile torch's sources first, which
    is what the benchmark times and this test does not (test_first_use_runs_cold_then_warm checks the prefix)."""
    env = measure.child_env(tmp_path)
    del env["PYTHONPYCACHEPREFIX"]
    proc = subprocess.run([sys.executable, "-c", measure.FIRST_USE, "cpu", "ours", "lif"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    assert times["first_use_s"] >= times["first_forward_s"] > 0 and times["torch_and_cuda_init_s"] > 0


def test_first_use_runs_cold_then_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = ("import json, os, sys; print(json.dumps({'first_use_s': 0.5, 'first_forward_s': 0.25, "
             "'cache_dir': os.environ['AUTOCUDA_CACHE_DIR'], 'cupy_dir': os.environ['CUPY_CACHE_DIR'], "
             "'writes_bytecode': not sys.flags.dont_write_bytecode, 'bytecode_dir': sys.pycache_prefix}))")
    monkeypatch.setattr(measure, "FIRST_USE", child)
    monkeypatch.setattr(measure, "BYTECODE", "")  # (its imports would take most of the test, and nothing reads them)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as on the lent GPU machines: the children must write it
    assert suite.main(["--device", "cpu", "--quick", "--parts", "first-use", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    rows = [r for r in results["first_use"]["rows"] if r["system"] == "ours"]
    assert [r["cache"] for r in rows] == ["cold", "warm"] and rows[0]["cache_dir"] == rows[1]["cache_dir"]
    assert all(r["first_use_s"] == 0.5 and r["process_wall_s"] > 0 for r in rows)
    assert all(r["writes_bytecode"] and Path(r["bytecode_dir"]).parent == Path(r["cache_dir"]).parent for r in rows)
    assert not Path(rows[0]["cache_dir"]).exists()  # a temporary folder, removed afterwards
    assert "first use in a fresh process" in (tmp_path / "table.txt").read_text()


def test_spike_function_is_our_sigmoid_surrogate() -> None:
    z = torch.linspace(-3, 3, 101, dtype=torch.float64, requires_grad=True)
    ours = Sigmoid(alpha=workloads.ALPHA)
    (grad,) = torch.autograd.grad(workloads.spike(z).sum(), z)
    (expected,) = torch.autograd.grad(ours(z).sum(), z)
    torch.testing.assert_close(grad, expected)
    assert torch.equal(workloads.spike(z), ours(z))


@pytest.mark.parametrize("key", list(workloads.WORKLOADS))
def test_step_functions_are_the_shipped_specs(key: str) -> None:
    """The eager loop and our reference agree in float64: spikes, final states and gradients."""
    w = workloads.WORKLOADS[key]
    torch.manual_seed(1)
    case = workloads.Case.draw(w, torch.float64, 6, 40, torch.device("cpu"))
    case.tensors = {k: v.double() for k, v in case.tensors.items()}  # parameters in the compute dtype
    case = case.mode(True)
    spikes, finals, _ = multi_step(w.key, case.x, *case.states, surrogate=Sigmoid(alpha=workloads.ALPHA),
                                   backend="reference", **w.params, **case.tensors)
    eager_spikes, eager_finals = workloads.run_loop(w.step, case.x, case.states, {**w.params, **case.tensors})
    assert torch.equal(spikes, eager_spikes) and spikes.float().mean() > 0
    for a, b in zip(finals, eager_finals):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(spikes, case.grad_inputs, case.g)
    eager_grads = torch.autograd.grad(eager_spikes, case.grad_inputs, case.g)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("key", workloads.ZOO)
def test_zoo_workloads_take_the_spec_defaults(key: str) -> None:
    """Every parameter passed explicitly, at the spec's default; initial states as the spec's."""
    w, spec = workloads.WORKLOADS[key], load_spec(key)
    assert w.params == {p.name: p.default for p in spec.params}
    assert w.initial == tuple(s.init for s in spec.states)
    assert w.sj is None and w.no_compile is None and isinstance(w.step, workloads.SpecStep)


def test_spikingjelly_keyword_mismatch_is_a_note() -> None:
    fake = types.SimpleNamespace(eif_multi_step=lambda x_seq, v, tau=2.0, surrogate_function=None: None)
    sj = systems.SpikingJelly(functional=fake, surrogate=None, version="fake")
    with pytest.raises(systems.Skip, match="takes no .*delta_t"):
        sj.kwargs(workloads.WORKLOADS["eif"])
    with pytest.raises(systems.Skip, match="no SpikingJelly counterpart"):
        sj.kwargs(workloads.WORKLOADS["adex"])
    assert measure.why(systems.Skip("why")) == "skipped: why"
    assert measure.why(ValueError("bad\nmore")) == "error: ValueError: bad"


def test_shapes_and_workloads() -> None:
    assert suite._shape("8x8M") == (8, 8 << 20) and suite._shape("4x4096") == (4, 4096)
    assert report.count(64 << 10) == "64K" and report.count(4096) == "4096"
    assert suite._shape_list(suite.FULL_SHAPES) == "8x8M,64x1M,256x64K,1024x16K,4x4096"
    assert all(suite._shape(text) == shape for shape in suite.FULL_SHAPES
               for text in suite._shape_list([shape]).split(","))
    assert workloads.CORE == ("lif", "parametric_lif", "qif", "eif", "izhikevich", "adex")
    assert workloads.ZOO == ("alif", "cuba_lif", "sfa_lif", "resonate_fire", "fitzhugh_nagumo", "two_compartment")
    assert suite._workloads("zoo") == list(workloads.ZOO) and suite._workloads("all") == list(workloads.WORKLOADS)
    assert suite._workloads("alif,core,lif") == ["alif", *workloads.CORE]  # in order given, each once
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload nope .*groups: core, zoo, all"):
        suite._workloads("lif,nope")


def _run_bench_module(monkeypatch: pytest.MonkeyPatch, *options: str) -> int | str | None:
    """`python -m bench OPTIONS` in this process: bench/__main__.py run as __main__; its exit status."""
    monkeypatch.setattr(sys, "argv", ["bench", *options])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("bench", run_name="__main__", alter_sys=True)
    return stop.value.code


def test_python_m_bench_hands_its_options_to_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(suite, "main", lambda argv: seen.append(list(argv)) or 3)
    options = ["--quick", "--device", "cpu", "--workloads", "plif,lif"]
    assert _run_bench_module(monkeypatch, *options) == 3  # the suite's exit status is the command's
    assert _run_bench_module(monkeypatch) == 3
    assert seen == [options, []]


def test_bench_help_names_the_default_shapes(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_bench_module(monkeypatch, "--help") == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "usage: python -m bench" in help_text and "8x8M,64x1M,256x64K,1024x16K,4x4096" in help_text
    assert "issue" not in help_text


def _imported_names(path: Path) -> set[str]:
    """The top-level package of every import statement in a file, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_package_never_imports_the_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    """bench imports autocuda, never the other way round; `autocuda bench` is no command, and --help says where
    the benchmark is."""
    importers = [path for path in sorted((ROOT / "autocuda").rglob("*.py")) if "bench" in _imported_names(path)]
    assert importers == []
    assert "autocuda" in _imported_names(ROOT / "bench" / "measure.py")  # (the check above sees imports)
    with pytest.raises(SystemExit):
        cli.main(["bench", "--quick"])
    with pytest.raises(SystemExit):
        cli.main(["list", "--quick"])  # options after a command are refused
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "python -m bench" in " ".join(capsys.readouterr().out.split())


def test_resume_keeps_the_rows_of_a_run_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_plot(monkeypatch)
    args = ["--device", "cpu", "--quick", "--shapes", "4x32,3x16", "--dtypes", OTHER_RUNS_DTYPE, "--workloads", "lif",
            "--parts", "speed", "--out", str(tmp_path)]
    assert suite.main(args) == 0
    first = json.loads((tmp_path / "results.json").read_text())["speed"]
    lines = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert len(lines) == 4
    # cut short after the first shape's two rows, in the middle of the third
    (tmp_path / "progress.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:20])
    measured = []
    real = measure.Runner.speed_row

    def recording(self, case, ref):
        measured.append(tuple(case.x.shape))
        return real(self, case, ref)

    monkeypatch.setattr(measure.Runner, "speed_row", recording)
    assert suite.main([*args, "--resume"]) == 0
    again = json.loads((tmp_path / "results.json").read_text())["speed"]
    assert measured == [(3, 16), (3, 16)], "only the shape that was not finished is measured"
    assert again[:2] == first[:2] and len(again) == 4
    assert len((tmp_path / "progress.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("whole_loop", [True, False])
def test_compiled_loop_and_step_match_the_eager_loop(whole_loop: bool) -> None:
    """Both forms of the torch.compile peer (the unrolled loop; the step alone, for long loops) compute what the
    eager loop does, forward and backward (backend "eager": the graphs Dynamo captures, run as captured; what
    AOTAutograd and Inductor make of a graph is torch's to check, and costs seconds here)."""
    w = workloads.WORKLOADS["parametric_lif"]
    torch.manual_seed(2)
    case = workloads.Case.draw(w, torch.float32, 5, 24, torch.device("cpu")).mode(True)
    spikes, finals = systems.compiled(case, whole_loop=whole_loop, backend="eager")()
    eager_spikes, eager_finals = systems.eager(case)()
    assert torch.equal(spikes, eager_spikes) and spikes.sum() > 0
    torch.testing.assert_close(finals, eager_finals)
    grads = torch.autograd.grad(spikes, case.grad_inputs, case.g)
    torch.testing.assert_close(grads, torch.autograd.grad(eager_spikes, case.grad_inputs, case.g))


def test_modes_option_measures_only_the_modes_named(tmp_path: Path) -> None:
    assert suite.main(["--device", "cpu", "--quick", "--workloads", "lif", "--parts", "speed",
                       "--dtypes", OTHER_RUNS_DTYPE, "--shapes", "4x16", "--modes", "inference", "--no-peers",
                       "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["speed"]
    assert [(r["mode"], r["check"]) for r in rows] == [("inference", "ok")]
    with pytest.raises(SystemExit):
        suite.main(["--modes", "inference,backward"])


def test_timed_calls_return_the_spikes_of_the_checked_calls_without_final_states() -> None:
    """The timed forms of ours and of the compiled loop (`TIMED_FINAL_STATES`) give the spikes and gradients of
    the forms that return final states, and no final states."""
    torch.manual_seed(3)
    case = workloads.Case.draw(workloads.WORKLOADS["izhikevich"], torch.float32, 5, 24, torch.device("cpu")).mode(True)
    for make in (systems.ours, lambda c, **kw: systems.compiled(c, backend="eager", **kw)):
        (spikes, finals), (timed, none) = make(case)(), make(case, final_states=False)()
        assert len(finals) == 2 and none == () and torch.equal(spikes, timed)
        grads = torch.autograd.grad(spikes, case.grad_inputs, case.g)
        assert all(map(torch.equal, grads, torch.autograd.grad(timed, case.grad_inputs, case.g)))


def test_table_marks_compile_times_of_the_step_form() -> None:
    row = dict(dataclasses.asdict(measure.Row("LIF", "lif", "float32", "training", 1024, 16 << 10, 0.1, ours_ms=0.2,
                                            compile_ms=9.0, compile_form="step")))
    text = report.table([row | measure.Row(**row).derived()])
    assert f"9.000{report.STEP_MARK}" in text and "step alone, called by a Python loop" in text
    row["compile_form"] = "loop"
    assert report.STEP_MARK not in report.table([row | measure.Row(**row).derived()])


MY_NEURON = """name = "my_neuron"
charge = "v + (x - (v - v_reset) - w) / tau"
[params]
tau = 2.0
k = { default = 0.5, kind = "tensor", learnable = true }
v_threshold = 1.0
v_reset = 0.0
[states]
v = "v_reset"
w = 0.0
[updates]
w = "w - w / 10 + k * s"
"""


@pytest.fixture()
def my_neuron(tmp_path: Path) -> Path:
    path = tmp_path / "my_neuron.toml"
    path.write_text(MY_NEURON)
    return path


def test_a_spec_file_is_a_workload(my_neuron: Path) -> None:
    names = suite._workloads(f"lif,{my_neuron},lif")
    assert names == ["lif", str(my_neuron)]
    w = workloads.workload(str(my_neuron))
    assert w is workloads.spec_workload(str(my_neuron)) and w.label == "my_neuron" and w.key == str(my_neuron)
    assert w.params == {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0} and w.tensors == {"k": 0.5}
    assert w.initial == (0.0, 0.0) and w.sj is None and w.no_compile is None
    assert isinstance(w.step, workloads.SpecStep) and repr(w.step) == f"SpecStep({str(my_neuron)!r})"


def test_bad_spec_files_are_usage_errors_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="spec file 'missing.toml': .*No such file"):
        suite._workloads("lif,missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(MY_NEURON.replace("(v - v_reset)", "(v - v_rest)"))
    with pytest.raises(argparse.ArgumentTypeError, match="bad.toml.*charge.*v_rest"):
        suite._workloads(str(bad))


def test_quick_run_of_a_spec_file(my_neuron: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workloads FILE`: the same rows as a shipped workload, checked against the spec's reference."""
    without_plot(monkeypatch)
    out = tmp_path / "out"
    assert suite.main(["--device", "cpu", "--quick", "--workloads", f"lif,{my_neuron}", "--parts", "speed",
                       "--dtypes", OTHER_RUNS_DTYPE, "--shapes", "4x32", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [r for r in results["speed"] if r["spec"] == str(my_neuron)]
    assert [(r["workload"], r["mode"], r["check"]) for r in rows] == [("my_neuron", "inference", "ok"),
                                                                      ("my_neuron", "training", "ok")]
    assert all(r["ours_ms"] > 0 and r["eager_ms"] > 0 and r["check_figures"]["spike_rate"] > 0 for r in rows)
    assert "grad_k_rel_err" in rows[1]["check_figures"]
    assert results["workloads"][str(my_neuron)]["eager_step"] == f"SpecStep({str(my_neuron)!r})"
    assert "my_neuron" in (out / "table.txt").read_text()


def test_compiled_loop_of_a_spec_file_matches_its_eager_loop(my_neuron: Path) -> None:
    """torch.compile of the loop over the spec's reference (backend "eager": the graphs Dynamo captures)."""
    w = workloads.workload(str(my_neuron))
    torch.manual_seed(4)
    case = workloads.Case.draw(w, torch.float32, 5, 24, torch.device("cpu")).mode(True)
    spikes, finals = systems.compiled(case, backend="eager")()
    eager_spikes, eager_finals = systems.eager(case)()
    assert torch.equal(spikes, eager_spikes) and spikes.sum() > 0
    torch.testing.assert_close(finals, eager_finals)
    grads = torch.autograd.grad(spikes, case.grad_inputs, case.g)
    torch.testing.assert_close(grads, torch.autograd.grad(eager_spikes, case.grad_inputs, case.g))


# -- the network part --------------------------------------------------------------------------------------------
def test_the_network_part_runs_only_when_asked_for():
    parser = argparse.ArgumentParser()
    suite.add_arguments(parser)
    assert "network" not in parser.parse_args([]).parts
    assert parser.parse_args(["--parts", "network"]).parts == ["network"]


def test_network_rows_train_the_same_model_with_each_neuron():
    from bench import network

    rows = network.measure_all(["ours", "loop"], [(2, 2)], ["float32"], 1, torch.device("cpu"), warmup=0)
    assert [r["system"] for r in rows] == ["ours", "loop"]
    assert all(r["step_ms"] > 0 and r["first_step_s"] > 0 for r in rows)
    table = network.format_table(rows + [{"system": "sj", "T": 2, "B": 2, "precision": "float32",
                                          "skipped": "ImportError: no spikingjelly"}])
    assert "skipped: ImportError" in table and table.count("\n") == 4


def test_network_systems_name_a_neuron_a_mode_and_a_layout():
    from bench import network

    assert all(network.known(s) for s in network.SYSTEMS)
    assert network.mode_of("ours-rc-compiled-ro-cl") == "reduce-overhead" and network.mode_of("sj-cl") == "eager"
    assert network.neuron_of("loop-compiled-ro-cl") == "loop-compiled-ro" and not network.known("ours-cl-ro")
    x = torch.rand(2, 2, 3, 32, 32)
    rows = network.measure_all(["ours-cl", "ours-fused-rc-cl"], [(2, 2)], ["float32"], 1, torch.device("cpu"),
                               warmup=0)
    assert all("skipped" not in r for r in rows), rows
    model = network.build("ours-cl", torch.device("cpu"))
    assert model.blocks[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert model(x.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (2, 2))).shape == (2, 10)


def test_the_network_model_is_the_same_with_our_neuron_and_the_plain_loop():
    """Our LIF layer and the benchmark's plain loop are the same neuron: equal logits from equal weights."""
    from bench import network

    torch.manual_seed(0)
    ours = network.SpikingVGG(network._ours).double()
    loop = network.SpikingVGG(network.LoopLIF).double()
    loop.load_state_dict(ours.state_dict())
    x = torch.rand(2, 2, 3, 32, 32, dtype=torch.float64) * 3
    torch.testing.assert_close(ours(x), loop(x))


def test_ddp_rows_wrap_the_model_and_scale_against_one_process(tmp_path, monkeypatch):
    """bench.ddp in a process group of one (gloo): each system trains the VGG inside DistributedDataParallel (with
    the DDP options asked for), a system that fails is a row saying why; the efficiency of a row is its samples/s
    over N times one process's."""
    import torch.distributed as dist

    from bench import ddp

    wrapped = []

    class Recorded(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            wrapped.append((self.gradient_as_bucket_view, kwargs))

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", Recorded)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        rows = ddp.run_systems(["ours", "no-such-system"], 1, 2, "float32", 1, torch.device("cpu"), warmup=0,
                               bucket_view=True, sync_buffers=False)
    finally:
        dist.destroy_process_group()
    assert len(wrapped) == 1 and wrapped[0][0]  # DDP's options reach the model; the unknown system builds none
    assert ddp.buffer_option(False).items() <= wrapped[0][1].items()
    assert rows[0]["gradient_as_bucket_view"] and not rows[0]["sync_buffers"]
    assert rows[0]["gpus"] == 1 and rows[0]["samples_per_s"] == pytest.approx(2e3 / rows[0]["step_ms"])
    assert "KeyError" in rows[1]["skipped"]
    two = {**rows[0], "gpus": 2, "samples_per_s": 1.8 * rows[0]["samples_per_s"]}
    scaled = ddp.with_efficiency([rows[0], two, rows[1]])
    assert scaled[0]["efficiency"] == 1.0 and scaled[1]["efficiency"] == pytest.approx(0.9)
    table = ddp.format_table(scaled)
    assert "90.0%" in table and "skipped: KeyError" in table


# -- the sj-classes part -----------------------------------------------------------------------------------------
def test_the_sj_classes_part_times_both_libraries_and_says_why_a_class_cannot_run():
    """Two classes on the CPU (the online steps and the shared noise), in the report; a class that cannot be
    built is a row saying why, not the end of the run; the part runs only when asked for."""
    from bench import sj_classes

    parser = argparse.ArgumentParser()
    suite.add_arguments(parser)
    assert "sj-classes" not in parser.parse_args([]).parts
    assert parser.parse_args(["--parts", "sj-classes"]).parts == ["sj-classes"]
    rows = sj_classes.run(4, 64, 1, "cpu", ["float32"], ["OTTTLIFNode", "NoisyCUBALIFNode"])
    assert [(r["class"], r["kind"], r["shape"]) for r in rows] == [("OTTTLIFNode", "online", [4, 64]),
                                                                   ("NoisyCUBALIFNode", "training", [4, 1, 256])]
    for r in rows:
        assert r["ours_ms"] > 0 and "ours_skipped" not in r, r
        if systems.version("spikingjelly") is None:
            assert "not importable" in r["sj_skipped"]
        else:  # built alike (the same noise episode): the same outputs
            assert r["sj_ms"] > 0 and r["agreement"] == 1.0 and r["speedup"] > 0, r
    broken = sj_classes.Case(lambda m: m.NoSuchNode(), sj_classes.flat)
    row = sj_classes.measure_class("NoSuchNode", broken, "SpikingJelly not importable", 4, 64, 1, "cpu", "float32")
    assert row["sj_skipped"] == "SpikingJelly not importable" and row["ours_skipped"].startswith("AttributeError")
    text = report.summary({"environment": {"device": "cpu", "torch": torch.__version__, "autocuda": "0",
                                           "spikingjelly": None}, "copy_bandwidth_GBps": 1.0,
                           "sj_classes": rows + [row]})
    assert "OTTTLIFNode (T steps)" in text and "NoisyCUBALIFNode" in text and "ours skipped: AttributeError" in text
