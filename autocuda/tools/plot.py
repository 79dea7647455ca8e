"""Plots of spikes and states, and of a neuron spec's response to test inputs (needs matplotlib: the `plot` extra).

- `raster(spikes)`: spikes [T, *] as a raster, one row per neuron, a tick per spike;
- `traces(values, threshold=...)`: states [T, *] over time, the threshold dashed, spikes marked;
- `rate_histogram(rates)`: firing rates per neuron (a tensor, a dict of them, or a `Monitor`);
- `drive(spec, "step" | "ramp" | "noise")`: one neuron of a spec run on a test input (`INPUTS`): its input,
  spikes, state sequences and threshold;
- `response(spec, input)`: a figure of `drive`'s result: input, each state (the membrane with its threshold and
  spikes), spike train;
- `fi_curve(spec)`, `plot_fi(spec)`: the firing rate (spikes per step) against a constant input;
- `save(figure, path)`: writes .png, .svg or .pdf.

matplotlib is imported on first use, so `import autocuda.plot` works without it; drawing without it raises an
ImportError that names the extra. `drive` and `fi_curve` compute with the torch reference on the CPU in float64,
and need no matplotlib. `autocuda plot SPEC` draws `response` (or `plot_fi` with --fi) into a file.
"""
from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..call import functional as F
from ..spec.load import load_spec
from ..spec.model import NeuronSpec
from .monitor import Monitor

__all__ = ["raster", "traces", "rate_histogram", "drive", "Response", "response", "fi_curve", "plot_fi", "save",
           "INPUTS", "FORMATS", "MAX_STEPS", "SEEDS", "MAX_AMPLITUDE", "MAX_CURRENTS", "MAX_BINS", "MAX_DPI"]

Tensor = torch.Tensor
MISSING = "autocuda.tools.plot needs matplotlib: pip install 'autocuda[plot]' (or pip install matplotlib)"
FORMATS = (".png", ".svg", ".pdf")
# The most time steps `drive` and `fi_curve` run: the reference takes about 0.3 ms a step, and a figure shows no more
MAX_STEPS = 10_000
# The seeds torch's generators take
SEEDS = range(-2**63, 2**64)
# The largest input amplitude `drive` takes: inputs reach several times it (a ramp twice), and matplotlib cannot
# draw values spanning nearly float64's range (its tick locator overflows)
MAX_AMPLITUDE = 1e300
# The most currents `fi_curve` runs (each is a neuron run for T steps), and the most bins of `rate_histogram`
MAX_CURRENTS = 1000
MAX_BINS = 1000
# The highest resolution `save` writes (a 7 x 3 inch figure at 1000 dpi is 84 MB of pixels)
MAX_DPI = 1000


def pyplot() -> Any:
    """matplotlib.pyplot, or an ImportError naming the `plot` extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(MISSING) from error
    return plt


def _axes(ax: Any) -> Any:
    if ax is not None:
        if not callable(getattr(ax, "plot", None)):
            raise TypeError(f"ax: expected matplotlib Axes or None, got {type(ax).__name__}")
        return ax
    return pyplot().subplots(figsize=(7, 3))[1]


def _columns(values: Tensor, name: str, max_neurons: int | None = None) -> Tensor:
    """values [T, *] as a CPU float tensor [T, N], of the first `max_neurons` neurons (all for None). Those are
    picked before anything is copied: a large record (or an expanded tensor) was copied whole, in float64, to draw
    a few of its neurons."""
    if not isinstance(values, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor [T, *], got {type(values).__name__}")
    if values.dim() == 0:
        raise ValueError(f"{name}: expected a tensor of shape [T, *], got a 0-dim tensor")
    if values.numel() == 0:
        raise ValueError(f"{name}: nothing to draw, an empty tensor of shape {tuple(values.shape)}")
    v = values.detach()
    if max_neurons is not None and max_neurons < v.shape[1:].numel():
        if v.dim() == 2:
            v = v[:, :max_neurons]
        else:  # the first neurons in the flattened order, gathered without flattening the whole tensor
            index = torch.unravel_index(torch.arange(max_neurons, device=v.device), v.shape[1:])
            v = v[(slice(None),) + tuple(index)]
    return v.reshape(v.shape[0], -1).double().cpu()


def _neurons(max_neurons: Any) -> int | None:
    """`max_neurons` checked: an int > 0, or None for all."""
    if max_neurons is not None and (isinstance(max_neurons, bool) or not isinstance(max_neurons, int)
                                    or max_neurons <= 0):
        raise ValueError(f"max_neurons: expected an int > 0 or None, got {max_neurons!r}")
    return max_neurons


# -- drawing recorded data ------------------------------------------------------------------------------------
def raster(spikes: Tensor, ax: Any = None, *, max_neurons: int | None = None, title: str | None = None) -> Any:
    """A spike raster of spikes [T, *] (neurons flattened; the first `max_neurons` of them); returns the axes."""
    s = _columns(spikes, "spikes", _neurons(max_neurons))
    ax = _axes(ax)
    times, neurons = torch.nonzero(s, as_tuple=True)
    ax.scatter(times.numpy(), neurons.numpy(), marker="|", s=40, color="k", linewidths=1)
    ax.set_xlim(-0.5, s.shape[0] - 0.5)
    ax.set_ylim(-0.5, max(s.shape[1], 1) - 0.5)
    ax.set_xlabel("time step")
    ax.set_ylabel("neuron")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def _threshold_columns(threshold: float | Tensor, values: Tensor, max_neurons: int | None = None
                       ) -> float | Tensor:
    """`threshold` against values [T, *]: a number or a one-element tensor as a float; one value per step ([T], or
    [T, 1, ...]) as [T, 1]; the values' own shape (one per neuron and step) as [T, N]. Anything else is refused,
    a threshold of the neuron shape too: where that shape is (T,), it cannot be told from one value per step."""
    if isinstance(threshold, bool) or not isinstance(threshold, (numbers.Real, Tensor)):  # numpy's numbers too
        raise TypeError(f"threshold: expected a number or a tensor, got {type(threshold).__name__}")
    if not isinstance(threshold, Tensor) or threshold.numel() == 1:
        return float(threshold)
    if threshold.shape == values.shape[1:]:
        raise ValueError(f"threshold: shape {tuple(threshold.shape)} is the neuron shape of the values "
                         f"{tuple(values.shape)}: pass a threshold per neuron expanded over time "
                         f"(threshold.expand_as(values)), or one value per step as [T, 1]")
    T = values.shape[0]
    if threshold.dim() >= 1 and threshold.shape[0] == T and (threshold[0].numel() == 1
                                                              or threshold.shape == values.shape):
        return _columns(threshold, "threshold", max_neurons)
    raise ValueError(f"threshold: expected a number, one value per step [T] or the values' shape "
                     f"{tuple(values.shape)}, got shape {tuple(threshold.shape)}")


def traces(values: Tensor, ax: Any = None, *, threshold: float | Tensor | None = None, spikes: Tensor | None = None,
           max_neurons: int = 8, label: str = "v", title: str | None = None) -> Any:
    """Traces of values [T, *] (the first `max_neurons` neurons) with `threshold` dashed (a number; one value per
    step, [T]; or one per neuron and step, the values' shape), and spike times (spikes, the values' shape) marked
    on the trace; returns the axes."""
    v = _columns(values, "values", _neurons(max_neurons))
    limit = None if threshold is None else _threshold_columns(threshold, values, max_neurons)
    if spikes is not None:
        s = _columns(spikes, "spikes", max_neurons)
        if s.shape[0] != v.shape[0]:
            raise ValueError(f"spikes: {s.shape[0]} time steps, values {v.shape[0]}")
        if spikes.shape != values.shape:
            raise ValueError(f"spikes: expected the values' shape {tuple(values.shape)}, got {tuple(spikes.shape)}")
    ax = _axes(ax)
    steps = torch.arange(v.shape[0]).numpy()
    for i in range(v.shape[1]):
        ax.plot(steps, v[:, i].numpy(), color=f"C{i % 10}", linewidth=1.2, label=label if i == 0 else None)
    if isinstance(limit, float):
        ax.axhline(limit, color="k", linestyle="--", linewidth=1, label="threshold")
    elif limit is not None:
        limit = limit[:, :max_neurons]
        for i in range(limit.shape[1]):  # one column: every neuron's; else each neuron's, in its trace's colour
            ax.plot(steps, limit[:, i].numpy(), linestyle="--", linewidth=1, label="threshold" if i == 0 else None,
                    color="k" if limit.shape[1] == 1 else f"C{i % 10}")
    if spikes is not None:
        times, neurons = torch.nonzero(s, as_tuple=True)
        ax.scatter(times.numpy(), v[times, neurons].numpy(), marker="o", s=14, color="C3", zorder=3, label="spike")
    ax.set_xlabel("time step")
    ax.set_ylabel(label)
    ax.legend(loc="upper right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def rate_histogram(rates: Tensor | Mapping[str, Tensor] | Monitor, ax: Any = None, *, bins: int = 20,
                   title: str | None = None) -> Any:
    """Histogram of firing rates per neuron: a tensor of rates, {name: rates}, or a `Monitor` (each layer's
    rates per neuron, averaged over time); returns the axes."""
    if isinstance(rates, Monitor):
        groups = {name: rates.firing_rate(name, per_neuron=True) for name in rates.firing_rates()}
    elif isinstance(rates, Mapping):
        groups = dict(rates)
    else:
        groups = {"": rates}
    if not groups:
        raise ValueError("rates: no firing rates to draw (a Monitor needs recorded spikes)")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 0 < bins <= MAX_BINS:  # 10**9 took 8 GB
        raise ValueError(f"bins: expected an int > 0 and at most {MAX_BINS}, got {bins!r}")
    ax = _axes(ax)
    for i, (name, values) in enumerate(groups.items()):
        if not isinstance(values, Tensor):
            raise TypeError(f"rates: expected tensors of rates, got {type(values).__name__} for {name!r}")
        ax.hist(values.detach().flatten().double().cpu().numpy(), bins=bins, range=(0.0, 1.0), alpha=0.6,
                color=f"C{i % 10}", label=name or None)
    ax.set_xlabel("firing rate (spikes per step)")
    ax.set_ylabel("neurons")
    if len(groups) > 1 or next(iter(groups)):
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


# -- driving a spec -------------------------------------------------------------------------------------------
def _step(T: int, amplitude: float, generator: torch.Generator) -> Tensor:
    x = torch.zeros(T, dtype=torch.float64)
    x[T // 5:] = amplitude  # rest first: the response's onset is visible
    return x


def _ramp(T: int, amplitude: float, generator: torch.Generator) -> Tensor:
    return torch.linspace(0.0, 2.0 * amplitude, T, dtype=torch.float64)


def _noise(T: int, amplitude: float, generator: torch.Generator) -> Tensor:
    return amplitude * (1.0 + 0.5 * torch.randn(T, generator=generator, dtype=torch.float64))


# input name -> x [T] from (T, amplitude, generator): a step to `amplitude` after T/5 steps at 0, a ramp from 0
# to 2 * amplitude, Gaussian noise of mean `amplitude` and standard deviation amplitude / 2
INPUTS: dict[str, Callable[[int, float, torch.Generator], Tensor]] = {"step": _step, "ramp": _ramp, "noise": _noise}


@dataclasses.dataclass(frozen=True)
class Response:
    """One neuron's run: input x [T], spikes [T], each state's sequence [T] (after the reset of each step), and
    the threshold each step compared against ([T]; None when it cannot be evaluated)."""
    spec: NeuronSpec
    input: str
    x: Tensor
    spikes: Tensor
    states: dict[str, Tensor]
    threshold: Tensor | None


def _resolve(spec: NeuronSpec | str) -> NeuronSpec:
    """The spec to drive: one of a single input (the test inputs are one signal; a spec of several, as the
    shipped conductance_lif, failed inside the run asking for a tuple of tensors, also from `autocuda plot`)."""
    if isinstance(spec, str):
        spec = load_spec(spec)
    if not isinstance(spec, NeuronSpec):
        raise TypeError(f"spec: expected a NeuronSpec, a shipped spec's name or a .toml path, "
                        f"got {type(spec).__name__}")
    if len(spec.inputs) != 1:
        raise ValueError(f"spec: {spec.name!r} takes {len(spec.inputs)} inputs ({', '.join(spec.inputs)}); the test "
                         f"inputs drive neurons of one input (run it with functional.multi_step, and draw the "
                         f"result with traces and raster)")
    return spec


def _check_run(T: int, amplitude: float, seed: int = 0) -> None:
    if not isinstance(T, int) or isinstance(T, bool) or not 0 < T <= MAX_STEPS:
        raise ValueError(f"T: expected the number of time steps, an int > 0 and at most {MAX_STEPS}, got {T!r}")
    if not isinstance(amplitude, (int, float)) or isinstance(amplitude, bool) or not abs(amplitude) <= MAX_AMPLITUDE:
        raise ValueError(f"amplitude: expected a finite number of magnitude at most {MAX_AMPLITUDE:g}, "
                         f"got {amplitude!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed not in SEEDS:
        raise ValueError(f"seed: expected an int from -2**63 to 2**64 - 1 (torch's seeds), got {seed!r}")


def drive(spec: NeuronSpec | str, input: str = "step", *, T: int = 100, amplitude: float = 1.5, seed: int = 0,
          **params: Any) -> Response:
    """Run one neuron of `spec` (parameters: its defaults, overridden by `params`) on a test input: "step",
    "ramp" or "noise" (see `INPUTS`; `seed` fixes the noise)."""
    spec = _resolve(spec)
    if not isinstance(input, str) or input not in INPUTS:
        raise ValueError(f"input: expected one of {', '.join(INPUTS)}, got {input!r}")
    _check_run(T, amplitude, seed)
    generator = torch.Generator().manual_seed(seed)
    x = INPUTS[input](T, float(amplitude), generator)
    spikes, _, seqs = F.multi_step(spec, x.view(T, 1), store_state_seq=True, backend="reference", **params)
    assert seqs is not None  # asked for
    states = {s.name: seq.view(T) for s, seq in zip(spec.states, seqs)}
    return Response(spec, input, x, spikes.view(T), states, _threshold(spec, states, params))


def _threshold(spec: NeuronSpec, states: Mapping[str, Tensor], params: Mapping[str, Any]) -> Tensor | None:
    """The threshold of each step: the spec's expression of the parameters and of the states before the step
    (the initial states, then each step's result shifted by one). None where it uses what is not known here."""
    parsed = spec.parsed()
    values: dict[str, Any] = {p.name: params.get(p.name, p.default) for p in spec.params}
    symbols: dict[Any, Any] = {}
    for name, symbol in parsed.param_symbols.items():
        value = values.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            symbols[symbol] = float(value)
        elif isinstance(value, Tensor) and value.numel() == 1:
            symbols[symbol] = float(value.detach())
    for state in spec.states:
        init = values.get(state.init, 0.0) if isinstance(state.init, str) else state.init
        seq = states[state.name]
        before = torch.cat([seq.new_full((1,), float(init if init is not None else 0.0)), seq[:-1]])
        symbols[parsed.state_symbols[state.name]] = before
    expr = parsed.threshold_expanded
    if not expr.free_symbols <= set(symbols):
        return None
    from ..spec.torch_eval import evaluate

    return evaluate(expr, symbols).expand(len(next(iter(states.values())))).double()


def response(spec: NeuronSpec | str, input: str = "step", *, T: int = 100, amplitude: float = 1.5, seed: int = 0,
             **params: Any) -> Any:
    """A figure of one neuron's run (`drive`): the input, each state (the membrane with its threshold and the
    spikes marked), and the spike train."""
    run = drive(spec, input, T=T, amplitude=amplitude, seed=seed, **params)
    plt = pyplot()
    rows = 2 + len(run.states)
    fig, axes = plt.subplots(rows, 1, figsize=(7, 1.2 + 1.5 * rows), sharex=True)
    steps = torch.arange(T).numpy()
    axes[0].plot(steps, run.x.numpy(), color="0.3", linewidth=1.2)
    axes[0].set_ylabel("input x")
    axes[0].set_title(f"{run.spec.name}: {input} input (amplitude {amplitude:g}), "
                      f"{int(run.spikes.sum())} spikes in {T} steps", fontsize=10)
    for i, (name, seq) in enumerate(run.states.items()):
        membrane = i == 0
        # States are drawn as the step leaves them: the membrane after its reset, so a spike marks where it fell
        traces(seq, axes[1 + i], threshold=run.threshold if membrane else None,
               spikes=run.spikes if membrane else None, label=f"{name} (after reset)" if membrane else name)
        axes[1 + i].set_xlabel("")
    raster(run.spikes, axes[-1])
    axes[-1].set_ylabel("spikes")
    axes[-1].set_yticks([])
    fig.tight_layout()
    return fig


def fi_curve(spec: NeuronSpec | str, currents: Tensor | None = None, *, T: int = 200, **params: Any
             ) -> tuple[Tensor, Tensor]:
    """Firing rate (spikes per step over T steps) against constant input: (currents, rates), one neuron per
    current, all in one run. Default currents: 41 values from 0 to 4."""
    spec = _resolve(spec)
    _check_run(T, 1.0)
    currents = torch.linspace(0.0, 4.0, 41, dtype=torch.float64) if currents is None else currents
    if not isinstance(currents, Tensor) or currents.dim() != 1 or not 0 < currents.numel() <= MAX_CURRENTS:
        raise ValueError(f"currents: expected a non-empty 1-d tensor of at most {MAX_CURRENTS} input values")
    currents = currents.detach().double().cpu()
    x = currents.expand(T, -1).contiguous()
    spikes, _, _ = F.multi_step(spec, x, backend="reference", final_states=False, **params)
    return currents, spikes.double().mean(0)


def plot_fi(spec: NeuronSpec | str, currents: Tensor | None = None, *, T: int = 200, ax: Any = None,
            **params: Any) -> Any:
    """The f-I curve (`fi_curve`) as a figure; returns the figure."""
    spec = _resolve(spec)
    i, rates = fi_curve(spec, currents, T=T, **params)
    ax = _axes(ax)
    ax.plot(i.numpy(), rates.numpy(), "o-", markersize=3, color="C0")
    ax.set_xlabel("constant input x")
    ax.set_ylabel("firing rate (spikes per step)")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"{spec.name}: f-I curve over {T} steps", fontsize=10)
    ax.figure.tight_layout()
    return ax.figure


def save(figure: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write `figure` to `path` (.png, .svg or .pdf, by its suffix) and close it; returns the path."""
    if not callable(getattr(figure, "savefig", None)):
        raise TypeError(f"figure: expected a matplotlib Figure, got {type(figure).__name__}")
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"out: expected a file ending in {', '.join(FORMATS)}, got {str(path)!r}")
    if isinstance(dpi, bool) or not isinstance(dpi, (int, float)) or not 0 < dpi <= MAX_DPI:  # 10**6: bad_alloc
        raise ValueError(f"dpi: expected a number > 0 and at most {MAX_DPI}, got {dpi!r}")
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)
    return path
