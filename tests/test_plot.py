"""autocuda.plot and `autocuda plot`: drawing into files (matplotlib's Agg backend), what `drive` and
`fi_curve` compute, and a clear error without matplotlib."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from autocuda.call import functional as F
from autocuda.nn import LIFNode
from autocuda.tools import cli, plot
from autocuda.tools.monitor import Monitor

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
PNG = b"\x89PNG\r\n\x1a\n"


# -- what is computed (no drawing) ----------------------------------------------------------------------------
@pytest.mark.parametrize("input", list(plot.INPUTS))
def test_drive_runs_the_reference_on_the_input(input: str) -> None:
    run = plot.drive("izhikevich", input, T=60, amplitude=1.2, seed=3, b=0.1)
    assert run.x.shape == run.spikes.shape == (60,) and set(run.states) == {"v", "w"}
    spikes, _, seqs = F.multi_step("izhikevich", run.x.view(60, 1), store_state_seq=True, backend="reference", b=0.1)
    assert torch.equal(run.spikes, spikes.view(60)) and torch.equal(run.states["w"], seqs[1].view(60))
    assert run.threshold is not None and torch.equal(run.threshold, torch.ones(60, dtype=torch.float64))


def test_drive_inputs() -> None:
    assert plot.drive("lif", "step", T=10, amplitude=2.0).x.tolist() == [0.0, 0.0] + [2.0] * 8
    ramp = plot.drive("lif", "ramp", T=5, amplitude=1.0).x
    assert ramp.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    a, b = plot.drive("lif", "noise", seed=1).x, plot.drive("lif", "noise", seed=1).x
    assert torch.equal(a, b) and not torch.equal(a, plot.drive("lif", "noise", seed=2).x)
    assert abs(float(a.mean()) - 1.5) < 0.3


def test_adaptive_threshold_uses_the_states_before_each_step() -> None:
    run = plot.drive("alif", "step", T=80, amplitude=2.0, beta=0.3)
    a = run.states["a"]
    expected = 1.0 + 0.3 * torch.cat([torch.zeros(1, dtype=torch.float64), a[:-1]])
    assert run.threshold is not None and torch.allclose(run.threshold, expected)
    assert run.spikes.sum() > 0 and run.threshold.max() > 1.0


def test_fi_curve_is_the_rate_under_constant_input() -> None:
    currents, rates = plot.fi_curve("lif", torch.tensor([0.0, 0.5, 1.5, 3.0]), T=50)
    spikes, _, _ = F.multi_step("lif", torch.full((50, 1), 1.5, dtype=torch.float64), backend="reference")
    assert rates[0] == 0 and rates[1] == 0 and rates[2] == spikes.mean() and rates[3] >= rates[2]
    default_currents, default_rates = plot.fi_curve("if", T=20)
    assert default_currents.shape == default_rates.shape == (41,)
    assert bool((default_rates[1:] >= default_rates[:-1]).all())  # IF: monotone in the input


@pytest.mark.parametrize(("call", "match"), [
    (lambda: plot.drive("lif", "square"), r"^input: expected one of step, ramp, noise, got 'square'"),
    (lambda: plot.drive("lif", T=0), r"^T: expected the number of time steps"),
    (lambda: plot.drive("lif", amplitude=float("nan")), r"^amplitude: expected a finite number"),
    (lambda: plot.fi_curve("lif", torch.zeros(2, 2)), r"^currents: expected a non-empty 1-d tensor"),
    (lambda: plot.drive("lif", tau=-1.0), r"tau"),
    # past MAX_STEPS: ran for minutes, or failed in the allocator
    (lambda: plot.drive("lif", T=plot.MAX_STEPS + 1), r"^T: expected .* at most 10000, got 10001"),
    (lambda: plot.fi_curve("lif", T=plot.MAX_STEPS + 1), r"^T: expected .* at most 10000, got 10001"),
    # torch's own messages, naming no seed
    (lambda: plot.drive("lif", "noise", seed="a"), r"^seed: expected an int from -2\*\*63 to 2\*\*64 - 1"),
    (lambda: plot.drive("lif", "noise", seed=2**64), r"^seed: expected an int .* got 18446744073709551616"),
    (lambda: plot.drive("lif", "noise", seed=-2**63 - 1), r"^seed: expected an int"),
    (lambda: plot.drive("lif", "noise", seed=True), r"^seed: expected an int"),
])
def test_bad_arguments_are_named(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_the_extreme_seeds_are_taken() -> None:
    for seed in (-2**63, 2**64 - 1):
        assert plot.drive("lif", "noise", T=5, seed=seed).x.shape == (5,)


def test_spec_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match=r"^spec: expected a NeuronSpec"):
        plot.drive(3)


# -- drawing --------------------------------------------------------------------------------------------------
def test_response_and_fi_figures_are_written(tmp_path: Path) -> None:
    png = plot.save(plot.response("izhikevich", "ramp", T=40), tmp_path / "izh.png")
    assert png.read_bytes().startswith(PNG)
    svg = plot.save(plot.plot_fi("lif", T=30), tmp_path / "fi.svg")
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # save closes the figures


def test_response_draws_each_state_and_the_threshold() -> None:
    fig = plot.response("alif", "step", T=50)
    axes = fig.axes
    assert len(axes) == 4  # input, v, a, spikes
    assert [ax.get_ylabel() for ax in axes[1:3]] == ["v (after reset)", "a"]
    labels = [line.get_label() for line in axes[1].get_lines()]
    assert "threshold" in labels
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_raster_traces_and_histogram_of_a_monitor(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    layer = LIFNode(step_mode="m")
    with Monitor(layer) as mon:
        layer(torch.rand(20, 16, generator=torch.Generator().manual_seed(0)) * 3)
    fig, (a, b, c) = plt.subplots(3, 1)
    plot.raster(mon.sequence(""), a, title="raster")
    plot.traces(mon.sequence("", "v"), b, threshold=1.0, spikes=mon.sequence(""), max_neurons=3)
    plot.rate_histogram(mon, c)
    spikes = mon.sequence("")
    assert len(a.collections[0].get_offsets()) == int(spikes.sum())
    assert len([ln for ln in b.get_lines() if ln.get_label() != "threshold"]) == 3
    assert sum(p.get_height() for p in c.patches) == 16
    path = plot.save(fig, tmp_path / "monitor.pdf")
    assert path.read_bytes().startswith(b"%PDF")


def test_drawing_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"^spikes: expected a torch.Tensor \[T, \*\], got list"):
        plot.raster([[1, 0]])
    with pytest.raises(ValueError, match=r"^spikes: 3 time steps, values 4"):
        plot.traces(torch.zeros(4, 2), spikes=torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"^rates: no firing rates to draw"):
        plot.rate_histogram({})
    with pytest.raises(ValueError, match=r"^out: expected a file ending in \.png, \.svg, \.pdf, got '.*x\.jpg'"):
        plot.save(plot.plot_fi("if", T=5), tmp_path / "x.jpg")
    # each failed inside torch or matplotlib, or drew nothing without a word
    with pytest.raises(ValueError, match=r"^spikes: nothing to draw, an empty tensor of shape \(0, 3\)"):
        plot.raster(torch.zeros(0, 3))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"^max_neurons: expected an int > 0 or None"):
            plot.raster(torch.ones(2, 3), max_neurons=bad)
        with pytest.raises(ValueError, match=r"^max_neurons: expected an int > 0 or None"):
            plot.traces(torch.ones(2, 3), max_neurons=bad)
    with pytest.raises(TypeError, match=r"^threshold: expected a number or a tensor, got str"):
        plot.traces(torch.ones(2, 3), threshold="x")


def test_traces_check_the_shapes_of_spikes_and_threshold() -> None:
    """Spikes of more neurons than the values failed with a bare IndexError; a threshold per neuron [N] with
    matplotlib's error, or, where N == T, was drawn as a threshold that changes over time."""
    import matplotlib.pyplot as plt

    with pytest.raises(ValueError, match=r"^spikes: expected the values' shape \(10, 2\), got \(10, 5\)"):
        plot.traces(torch.rand(10, 2), spikes=torch.ones(10, 5))
    for T in (10, 3):
        with pytest.raises(ValueError, match=rf"^threshold: shape \(3,\) is the neuron shape of the values \({T}, 3\)"):
            plot.traces(torch.rand(T, 3), threshold=torch.tensor([0.5, 0.6, 0.7]))
    with pytest.raises(ValueError, match=r"^threshold: expected a number, one value per step \[T\] or the values' "
                                         r"shape \(10, 3\), got shape \(4,\)"):
        plot.traces(torch.rand(10, 3), threshold=torch.rand(4))
    per_neuron = plot.traces(torch.rand(3, 3), threshold=torch.tensor([0.5, 0.6, 0.7]).expand(3, 3))
    dashed = [line for line in per_neuron.get_lines() if line.get_linestyle() == "--"]
    assert [list(line.get_ydata()) for line in dashed] == [pytest.approx([t] * 3) for t in (0.5, 0.6, 0.7)]
    per_step = plot.traces(torch.rand(3, 3), threshold=torch.tensor([[0.5], [0.6], [0.7]]))
    dashed = [line for line in per_step.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == pytest.approx([0.5, 0.6, 0.7])
    plt.close("all")


def test_missing_matplotlib_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import of it raises ImportError
    with pytest.raises(ImportError, match=r"needs matplotlib: pip install 'autocuda\[plot\]'"):
        plot.response("lif")
    assert plot.drive("lif", T=5).spikes.shape == (5,)  # computing needs no matplotlib


# -- the command ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("input", ["step", "ramp", "noise"])
def test_cli_plot_writes_the_file(tmp_path: Path, capsys, input: str) -> None:
    out = tmp_path / f"lif-{input}.png"
    assert cli.main(["plot", "lif", "--input", input, "--out", str(out), "--steps", "30"]) == 0
    assert out.read_bytes().startswith(PNG)
    assert capsys.readouterr().out.strip() == f"wrote {out}"


def test_cli_plot_passes_parameters(tmp_path: Path, monkeypatch) -> None:
    seen = {}
    real = plot.response

    def response(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(plot, "response", response)
    out = tmp_path / "x.png"
    assert cli.main(["plot", "lif", "--param", "tau=5", "--param", "v_threshold=0.5", "--out", str(out)]) == 0
    assert seen["tau"] == 5.0 and seen["v_threshold"] == 0.5 and out.is_file()


def test_cli_plot_fi_svg_and_default_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plot", "qif", "--fi", "--out", "qif.svg", "--steps", "20"]) == 0
    assert "<svg" in (tmp_path / "qif.svg").read_text()
    assert cli.main(["plot", "if", "--steps", "10"]) == 0
    assert (tmp_path / "if-step.png").is_file()


@pytest.mark.parametrize(("argv", "message"), [
    (["plot", "lif", "--out", "x.jpg"], "--out: expected a file ending in .png, .svg, .pdf, got 'x.jpg'"),
    (["plot", "lif", "--steps", "0"], "--steps: expected a number of time steps > 0 and at most 10000, got 0"),
    (["plot", "lif", "--fi", "--steps", "100000000"], "--steps: expected a number of time steps > 0 and at most "
     "10000, got 100000000"),
    (["plot", "lif", "--input", "noise", "--seed", str(2**70)], "--seed: expected an integer from -2**63 to "
     "2**64 - 1 (torch's seeds), got 1180591620717411303424"),
    (["plot", "no_such_spec"], "no shipped spec named 'no_such_spec'"),
    (["plot", "lif", "--param", "tau"], "--param: expected NAME=NUMBER (e.g. tau=5), got 'tau'"),
    (["plot", "lif", "--param", "=2"], "--param: expected NAME=NUMBER"),
    (["plot", "lif", "--param", "taux=2"], "unknown parameter 'taux' for neuron 'lif'"),
])
def test_cli_plot_errors(tmp_path: Path, monkeypatch, capsys, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_plot_help_states_the_limit_of_steps() -> None:
    steps = next(a for a in cli._parser()._subparsers._group_actions[0].choices["plot"]._actions
                 if a.dest == "steps")
    assert f"at most {plot.MAX_STEPS})" in steps.help


def test_cli_plot_without_matplotlib(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    assert cli.main(["plot", "lif"]) == 2
    assert "pip install 'autocuda[plot]'" in capsys.readouterr().err


# -- the docs' gallery ------------------------------------------------------------------------------------------
def test_docs_gallery_plots_render_and_are_shown() -> None:
    import importlib.util

    docs = Path(__file__).resolve().parents[1] / "docs"
    spec = importlib.util.spec_from_file_location("autocuda_docs_hooks_plots", docs / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (docs / "tools.md").read_text()
    for name in hooks.TOOL_PLOTS:
        assert f"(img/plots/{name}.png)" in page, name
        assert hooks.tool_plot(name).startswith(PNG), name
    assert "tools.md" in (docs.parent / "mkdocs.yml").read_text()
