"""The tools under odd use: monitors, plots and the command line (a probe).

Faults pinned here (each test named after what was wrong):
- two monitors of one layer in step mode 'm': the first to finish a call turned store_v_seq off, which drops the
  call's v_seq, so the second recorded no membrane (and warned that the layer keeps none);
- `Monitor.summary()` failed with an IndexError on a record of 0 steps;
- plots copied a whole record to the CPU in float64 before picking the few neurons they draw (an expanded tensor
  of 10**11 elements asked for 800 GB); `rate_histogram(bins=10**9)` allocated 8 GB, `save(dpi=10**6)` failed in
  the allocator; `fi_curve` took any number of
  currents; an amplitude near float64's largest passed the check and failed inside matplotlib ("arange: cannot
  compute length"); a spec of two inputs (the shipped conductance_lif) failed inside the run asking for a tuple of
  tensors, also from `autocuda plot`; `input`, `ax`, `figure` and `dpi` of the wrong kind failed with errors naming
  none of them; a numpy float32 threshold was refused as no number;
- `autocuda new NAME --force` hung forever where NAME.toml is a FIFO; `plot --out` a FIFO said "File or stream is
  not seekable."; with stdout closed a command said "'NoneType' object has no attribute 'flush'"; `--amplitude`
  was named as the function's `amplitude`.
"""
from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import profile
from torch import nn

from autocuda.call import functional as F
from autocuda.nn import IzhikevichNode, LIFNode, Neuron, ParametricLIFNode
from autocuda.tools import cli, plot
from autocuda.tools.monitor import Monitor

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
T, B = 5, 3


def _net(mode: str, backend: str = "host") -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), LIFNode(step_mode=mode, backend=backend), nn.Linear(5, 3),
                         Neuron("izhikevich", step_mode=mode, backend=backend))


def _x() -> torch.Tensor:
    return torch.rand(T, B, 4, generator=torch.Generator().manual_seed(1)) * 3


def _run(net: nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    return net(x) if mode == "m" else torch.stack([net(x[t]) for t in range(x.shape[0])])


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plot.pyplot().close("all")


# -- monitors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["s", "m"])
def test_two_monitors_of_one_layer_both_record_the_membrane(mode: str) -> None:
    net, x = _net(mode), _x()
    first, second = Monitor(net), Monitor(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: "layer '1' has no tensor v_seq (step_mode 'm')"
        _run(net, x, mode)
    assert torch.equal(first.sequence("1", "v"), second.sequence("1", "v"))
    assert second.sequence("3", "v").shape == (T, B, 3)
    assert net[1].store_v_seq is False and net[3].store_v_seq is False  # off between calls
    first.disable()  # the other one alone turns it on and off
    _run(net, x, mode)
    assert len(second.records["1"]["v"]) == 2 * (T if mode == "s" else 1) and net[1].store_v_seq is False
    second.remove()
    first.enable()
    _run(net, x, mode)
    assert len(first.records["1"]["v"]) == 2 * (T if mode == "s" else 1) and net[1].store_v_seq is False
    first.remove()
    assert not net[1]._forward_hooks and not net[1]._forward_pre_hooks


def test_a_monitor_removed_after_a_call_that_raised_gives_store_v_seq_back() -> None:
    net = _net("m")
    mons = Monitor(net), Monitor(net)
    with pytest.raises(RuntimeError):
        net(torch.rand(T, B, 7))  # the wrong width: the Linear raises before the layers run
    with pytest.raises(TypeError, match="x_seq: expected a floating dtype"):
        net[1](torch.rand(T, B, 5, dtype=torch.complex64))  # raises inside the layer, after the pre-hooks
    assert net[1].store_v_seq is True
    mons[0].remove()
    assert net[1].store_v_seq is True  # the other still holds it
    mons[1].remove()
    assert net[1].store_v_seq is False


def test_summary_of_a_record_of_zero_steps() -> None:
    layer = LIFNode(step_mode="m", backend="host")
    mon = Monitor(layer)
    layer(torch.rand(0, 3))
    rows = mon.summary().splitlines()  # was an IndexError
    assert rows[1].split()[:3] == ["(net)", "0", "3"]


@pytest.mark.parametrize("mode", ["s", "m"])
@pytest.mark.parametrize("context", ["grad", "no_grad", "inference_mode"])
def test_records_are_the_outputs_and_states_and_change_nothing(mode: str, context: str) -> None:
    """A record equals what the layer gave at that call (not a view that a later step, a reset or the next call
    changes in place), and a monitored run gives the outputs and gradients of an unmonitored one."""
    x = _x()
    results = []
    for watched in (False, True):
        net = _net(mode)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        if watched:  # clones of what the layer gives, taken before the monitor's hook
            net[3].register_forward_hook(lambda layer, _, out, seen=seen: seen.append(
                (out.detach().clone(), (layer.v_seq if mode == "m" else layer.v).detach().clone())))
        mon = Monitor(net, states="all" if mode == "s" else "membrane") if watched else None
        ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[context]
        with ctx():
            out = _run(net, x, mode)
        if context == "grad":
            out.sum().backward()
        results.append((out.detach(), net[0].weight.grad))
        if mon is not None:
            net[1].reset()
            net[3].reset()
            spikes = torch.cat([s if mode == "m" else s[None] for s, _ in seen])
            v = torch.cat([v if mode == "m" else v[None] for _, v in seen])
            assert torch.equal(mon.sequence("3"), spikes) and torch.equal(mon.sequence("3", "v"), v)
            if mode == "s":
                _, _, seqs = F.multi_step("izhikevich", net[2](mon.sequence("1")), store_state_seq=True)
                assert torch.allclose(mon.sequence("3", "w"), seqs[1])
            mon.remove()
    assert torch.equal(results[0][0], results[1][0])
    if context == "grad":
        assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_network_moved_to_another_dtype_is_recorded_in_it(dtype: torch.dtype) -> None:
    net = _net("m", "reference").to(dtype)
    with Monitor(net) as mon:
        out = net(_x().to(dtype))
    assert mon.sequence("3").dtype == mon.sequence("1", "v").dtype == dtype
    assert torch.equal(mon.sequence("3"), out.detach())


def test_other_layer_classes_reattached_and_called_twice_per_step() -> None:
    layers = [ParametricLIFNode(step_mode="m", backend="host"), IzhikevichNode(step_mode="m", backend="host")]
    net = nn.Sequential(*layers)
    mon = Monitor(net, states="all")
    net(_x()[..., :2])
    mon.remove()
    for layer in layers:
        layer.reset()
    again = Monitor(net)  # a new monitor on the same layers: records its calls alone
    out = net(_x()[..., :2])
    assert mon.count == again.count == 4 and torch.equal(again.sequence("1"), out.detach())
    again.remove()
    shared = LIFNode(backend="host")  # one layer called twice a step: a record per call, in call order
    twice = nn.Sequential(shared, nn.Linear(4, 4), shared)
    with Monitor(twice) as per_call:
        twice(torch.ones(2, 4) * 3)
    assert per_call.layers == ("0",) and len(per_call.records["0"]["spike"]) == 2
    clone = copy.deepcopy(per_call)  # a copy of a monitor keeps its records
    assert torch.equal(clone.sequence("0"), per_call.sequence("0"))


# -- plots -----------------------------------------------------------------------------------------------------
class _Counted(torch.Tensor):
    """A tensor that notes the size of each conversion to float64 (what the plots copy to the CPU)."""
    converted: list[int] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.double:
            cls.converted.append(args[0].numel())
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("shape", [(6, 1000), (6, 10, 100)])
def test_plots_pick_the_neurons_they_draw_before_copying(shape: tuple[int, ...]) -> None:
    values = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    _Counted.converted = []
    ax = plot.traces(values.as_subclass(_Counted), threshold=values.as_subclass(_Counted), max_neurons=3)
    plot.raster((values > 0.5).float().as_subclass(_Counted), max_neurons=2)
    assert _Counted.converted == [6 * 3, 6 * 3, 6 * 2]  # was the whole record, each time
    drawn = [line.get_ydata() for line in ax.get_lines()[:3]]
    assert all(np.allclose(d, values.reshape(6, -1)[:, i].double().numpy()) for i, d in enumerate(drawn))


@pytest.mark.parametrize(("call", "error", "match"), [
    # (the limits' next values: the old code took them, and 10**9 bins or dpi, failing in the allocator or not)
    (lambda: plot.rate_histogram(torch.rand(5), bins=plot.MAX_BINS + 1), ValueError,
     r"^bins: expected an int > 0 and at most 1000"),
    (lambda: plot.rate_histogram(torch.rand(5), bins=2.5), ValueError, r"^bins: "),
    (lambda: plot.rate_histogram(torch.rand(5), bins=0), ValueError, r"^bins: "),
    (lambda: plot.fi_curve("lif", torch.zeros(plot.MAX_CURRENTS + 1), T=1), ValueError,
     r"^currents: expected a non-empty 1-d tensor of at most 1000"),
    (lambda: plot.response("lif", "ramp", T=10, amplitude=8e307), ValueError,
     r"^amplitude: expected a finite number of magnitude at most 1e\+300"),
    (lambda: plot.drive("lif", ["step"]), ValueError, r"^input: expected one of step"),
    (lambda: plot.drive("conductance_lif"), ValueError, r"^spec: 'conductance_lif' takes 2 inputs \(g_e, g_i\)"),
    (lambda: plot.plot_fi("conductance_lif"), ValueError, r"^spec: 'conductance_lif' takes 2 inputs"),
    (lambda: plot.raster(torch.ones(2, 2), ax=3), TypeError, r"^ax: expected matplotlib Axes or None, got int"),
    (lambda: plot.save(3, "x.png"), TypeError, r"^figure: expected a matplotlib Figure, got int"),
    (lambda: plot.save(plot.pyplot().figure(), "x.png", dpi=plot.MAX_DPI + 1), ValueError,
     r"^dpi: expected a number > 0"),
    (lambda: plot.save(plot.pyplot().figure(), "x.png", dpi=0), ValueError, r"^dpi: "),
])
def test_bad_plot_arguments_are_named(call, error: type, match: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=match):
        call()
    assert list(tmp_path.iterdir()) == []


def test_odd_but_valid_plot_inputs_draw() -> None:
    nan, inf = float("nan"), float("inf")
    plot.raster(torch.ones(1, 1))                                      # one step, one neuron
    plot.raster(torch.tensor([[nan, 1.0], [inf, 0.0]]))                # non-finite values: not spikes
    plot.traces(torch.tensor([[nan], [inf], [-inf]]), threshold=nan, spikes=torch.ones(3, 1))
    plot.traces(torch.rand(5), threshold=torch.rand(5), spikes=torch.ones(5))  # one neuron as [T]
    ax = plot.traces(torch.rand(3, 2), threshold=np.float32(0.5))      # was: "got float32"
    assert any(line.get_linestyle() == "--" and list(line.get_ydata()) == [0.5, 0.5] for line in ax.get_lines())
    plot.rate_histogram(torch.tensor([nan, 0.5, inf, 2.0]))
    plot.rate_histogram(torch.tensor(0.5), bins=plot.MAX_BINS)
    for amplitude in (plot.MAX_AMPLITUDE, -plot.MAX_AMPLITUDE):       # the largest amplitudes draw
        plot.response("qif", "ramp", T=10, amplitude=amplitude).savefig(os.devnull, format="png")
    plot.plot_fi("lif", torch.tensor([nan, inf, 1.0]), T=3)
    plot.response("izhikevich", "noise", T=1)


@pytest.mark.skipif(profile() != "slow", reason="every shipped spec and input at the largest amplitudes: --slow")
def test_every_spec_of_one_input_draws_at_the_largest_amplitudes() -> None:
    from autocuda.spec.load import list_specs, load_spec

    for name, _ in list_specs():
        if len(load_spec(name).inputs) != 1:
            continue
        for input in plot.INPUTS:
            for amplitude in (plot.MAX_AMPLITUDE, -plot.MAX_AMPLITUDE):
                figure = plot.response(name, input, T=30, amplitude=amplitude)
                figure.savefig(os.devnull, format="png")
                plot.pyplot().close(figure)


# -- the command line ------------------------------------------------------------------------------------------
def _main(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str, words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocuda: error: ") and words in lines[0], err


def test_new_refuses_a_fifo_or_a_directory_in_place_of_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo("piped.toml")
    reader = os.open("piped.toml", os.O_RDONLY | os.O_NONBLOCK)  # so that the old code's write ended, not hung
    try:
        code, _, err = _main(capsys, "new", "piped", "--force")
    finally:
        os.close(reader)
    assert code == 2
    _one_line(err, "name: piped.toml is not a regular file (a FIFO)")
    os.mkdir("folder.toml")
    code, _, err = _main(capsys, "new", "folder", "--force")
    assert code == 2
    _one_line(err, "name: folder.toml is not a regular file (a directory)")


def test_plot_refuses_an_out_that_is_no_regular_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo("piped.png")
    code, _, err = _main(capsys, "plot", "lif", "--steps", "5", "--out", "piped.png")
    assert code == 2
    _one_line(err, "--out: piped.png is not a regular file (a FIFO)")  # was "File or stream is not seekable."


@pytest.mark.parametrize("value", ["inf", "nan", "8e307"])
def test_plot_names_its_amplitude_option(value: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _main(capsys, "plot", "lif", "--input", "ramp", "--amplitude", value)
    assert code == 2
    _one_line(err, "--amplitude: expected a finite number of magnitude at most 1e+300")
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stdout_is_one_clear_error(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdout", None)  # as Python starts with file descriptor 1 closed (`autocuda list >&-`)
    for argv in (["list"], ["show", "lif"]):
        assert cli.main(argv) == 2
        _one_line(capsys.readouterr().err, "standard output is closed")


@pytest.mark.parametrize("kind", ["fifo", "directory", "not utf-8", "missing"])
def test_spec_paths_that_are_no_spec_file_are_one_line_errors(kind: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "odd.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "not utf-8":
        path.write_bytes(b'name = "odd"\ncharge = "v + x \xff"\n')
    words = {"fifo": "(a FIFO)", "directory": "(a directory)", "not utf-8": "not UTF-8", "missing": "odd.toml"}[kind]
    for argv in (["show", str(path)], ["plot", str(path), "--out", str(tmp_path / "o.png")]):
        code, _, err = _main(capsys, *argv)
        assert code == 2
        _one_line(err, words)


def test_every_command_has_help_and_bad_option_values_exit_2(capsys) -> None:
    parser = cli._parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in commands:
        code, out, _ = _main(capsys, name, "--help")
        assert code == 0 and out.startswith("usage: autocuda " + name)
    for argv in (["plot", "lif", "--steps", "x"], ["plot", "lif", "--seed", "1.5"], ["plot", "lif", "--input", "sq"],
                 ["show", "lif", "--dtype", "int8"], ["native", "frob"], ["nosuch"], []):
        code, out, err = _main(capsys, *argv)
        assert code == 2 and out == "" and "Traceback" not in err and err.strip().splitlines()[-1].startswith(
            "autocuda"), argv


def test_cache_with_an_unusable_cache_folder_falls_back_and_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    import tempfile

    from autocuda.toolchain import store

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the fallback goes there, not to /tmp
    (tmp_path / "tmp").mkdir()
    with pytest.warns(store.CacheWarning, match="is not a directory"):
        code, out, err = _main(capsys, "cache")
    assert code == 0 and str(tmp_path / "tmp") in out.splitlines()[0] and err == ""
