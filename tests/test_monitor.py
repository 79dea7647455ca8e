"""autocuda.monitor: what it records in both step modes, the memory cap, firing rates, hooks removed; and
SpikingJelly's monitors on our layers, ours on SpikingJelly's."""
from __future__ import annotations

import copy
import importlib
import io
import sys
import types
import warnings

import pytest
import torch
from torch import nn

from autocuda.call import functional as F
from autocuda.nn import IFNode, LIFNode, Neuron
from autocuda.tools.monitor import Monitor, MonitorFullWarning

T, B = 6, 3


def net_of(step_mode: str, second: str = "izhikevich") -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), LIFNode(step_mode=step_mode), nn.Linear(5, 3),
                         Neuron(second, step_mode=step_mode))


def inputs() -> torch.Tensor:
    return torch.rand(T, B, 4, generator=torch.Generator().manual_seed(1)) * 3


def run_single(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([net(x[t]) for t in range(x.shape[0])])


# -- what is recorded ----------------------------------------------------------------------------------------
def test_single_step_records_spikes_and_membrane_per_step() -> None:
    net, x = net_of("s"), inputs()
    expected_v = []
    with Monitor(net) as mon:
        outs = []
        for t in range(T):
            outs.append(net(x[t]))
            expected_v.append(net[1].v.clone())
    assert mon.layers == ("1", "3") and mon.keys("1") == ("spike", "v")
    assert len(mon.records["1"]["v"]) == T and mon.records["1"]["v"][0].shape == (1, B, 5)
    assert torch.equal(mon.sequence("1", "v"), torch.stack(expected_v))
    assert torch.equal(mon.sequence("3"), torch.stack(outs))


def test_multi_step_records_match_the_functional_state_sequences() -> None:
    net, x = net_of("m"), inputs()
    during = []
    net[1].register_forward_hook(lambda layer, *_: during.append(layer.store_v_seq))  # after the monitor's pre-hook
    with Monitor(net, states="all") as mon:
        assert net[1].store_v_seq is False
        out = net(x)
        assert during == [True]  # turned on for the call
        assert net[1].store_v_seq is False and net[3].store_v_seq is False  # and off after it
    assert net[1].store_v_seq is False and net[3].store_v_seq is False
    assert mon.keys("3") == ("spike", "v")  # 'all' in step mode 'm': what the layer keeps
    with torch.no_grad():
        h = net[0](x)
        spikes1, _, seqs1 = F.multi_step("lif", h, store_state_seq=True)
        spikes3, _, seqs3 = F.multi_step("izhikevich", net[2](spikes1), store_state_seq=True)
    assert torch.equal(mon.sequence("1", "v"), seqs1[0]) and torch.equal(mon.sequence("1"), spikes1)
    assert torch.equal(mon.sequence("3", "v"), seqs3[0]) and torch.equal(mon.sequence("3"), out.detach())


def test_a_copy_made_between_monitored_calls_keeps_the_layers_own_store_v_seq() -> None:
    """The monitor turns store_v_seq on for each call in step mode 'm' and off after it: a copy of the network made
    between calls (an EMA twin, a checkpoint) stored every call's v_seq for good where it was left on."""
    net, x = net_of("m"), inputs()
    with Monitor(net), torch.no_grad():
        net(x)
        twin = copy.deepcopy(net)
    assert twin[1].store_v_seq is False and twin[3].store_v_seq is False
    twin(x)
    assert getattr(twin[1], "v_seq", None) is None


def test_all_states_in_single_step_mode_match_the_functional_sequences() -> None:
    layer = Neuron("izhikevich", a=0.5, b=0.2)
    x = inputs()[..., 0]
    with Monitor(layer, states="all") as mon:
        run_single(layer, x)
    _, _, seqs = F.multi_step("izhikevich", x, store_state_seq=True, a=0.5, b=0.2)
    assert mon.keys("") == ("spike", "v", "w")
    assert torch.allclose(mon.sequence("", "w"), seqs[1]) and torch.allclose(mon.sequence("", "v"), seqs[0])


def test_state_without_a_sequence_in_multi_step_warns_once_and_is_skipped() -> None:
    net = net_of("m")
    mon = Monitor(net, names=["3"], states=("v", "w"))
    with pytest.warns(UserWarning, match=r"layer '3' has no tensor w_seq \(step_mode 'm'\); 'w' is not recorded"):
        net(inputs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net(inputs())  # once per key
    assert mon.records["3"]["w"] == [] and len(mon.records["3"]["v"]) == 2
    mon.remove()


def test_records_are_detached_and_on_the_layers_device() -> None:
    net, x = net_of("m"), inputs()
    with Monitor(net) as mon:
        out = net(x)
    assert out.requires_grad
    assert not mon.sequence("3").requires_grad and not mon.sequence("1", "v").requires_grad
    assert mon.sequence("1").device == x.device


def test_getitem_gives_every_key() -> None:
    net = net_of("m")
    with Monitor(net) as mon:
        net(inputs())
    assert set(mon["1"]) == {"spike", "v"} and mon["1"]["v"].shape == (T, B, 5)


# -- memory cap, clear, enable ----------------------------------------------------------------------------------
def test_max_bytes_stops_recording_whole_and_warns_once() -> None:
    net, x = net_of("s"), inputs()
    per_step = (B * 5 + B * 3) * 2 * 4  # spike and v of both layers, float32
    mon = Monitor(net, max_bytes=per_step * 2 + 8)
    with pytest.warns(MonitorFullWarning, match=r"memory cap \(max_bytes=\d+\) is reached at layer '1'") as caught:
        run_single(net, x)
    assert len([w for w in caught if issubclass(w.category, MonitorFullWarning)]) == 1
    assert mon.full and mon.nbytes == per_step * 2
    assert mon.sequence("1").shape[0] == 2 and mon.sequence("3", "v").shape[0] == 2  # whole steps kept
    mon.clear()
    assert not mon.full and mon.nbytes == 0 and mon.records["1"]["spike"] == []
    with pytest.warns(MonitorFullWarning):
        run_single(net, x)
    assert mon.sequence("1").shape[0] == 2
    mon.remove()


def test_max_records_counts_tensors() -> None:
    layer = LIFNode()
    mon = Monitor(layer, max_records=5)
    with pytest.warns(MonitorFullWarning, match=r"max_records=5"):
        run_single(layer, inputs())
    assert mon.count == 4 and len(mon.records[""]["spike"]) == 2


def test_disable_and_enable() -> None:
    layer = LIFNode()
    mon = Monitor(layer)
    mon.disable()
    layer(torch.rand(3))
    mon.enable()
    layer(torch.rand(3))
    assert len(mon.records[""]["spike"]) == 1


def test_remove_keeps_records_and_stops_recording() -> None:
    layer = LIFNode(step_mode="m")
    mon = Monitor(layer)
    layer(inputs())
    mon.remove()
    mon.remove()  # twice is fine
    layer(inputs())
    assert len(mon.records[""]["spike"]) == 1 and not layer._forward_hooks and not layer._forward_pre_hooks


# -- firing rates ---------------------------------------------------------------------------------------------
def test_firing_rates_and_summary() -> None:
    net = net_of("m")
    with Monitor(net) as mon:
        net(inputs())
        net(inputs())
    spikes = mon.sequence("1")
    assert spikes.shape == (2 * T, B, 5)
    assert torch.allclose(mon.firing_rate("1"), spikes.mean())
    assert torch.allclose(mon.firing_rate("1", per_neuron=True), spikes.mean(0))
    assert set(mon.firing_rates()) == {"1", "3"}
    table = mon.summary().splitlines()
    assert table[0].split() == ["layer", "steps", "neurons", "rate", "MiB"]
    assert table[1].split()[:4] == ["1", str(2 * T), str(B * 5), f"{float(spikes.mean()):.4f}"]


def test_shapes_that_differ_between_calls() -> None:
    layer = LIFNode(step_mode="m")
    with Monitor(layer) as mon:
        layer(torch.rand(T, 4))
        layer.reset()
        layer(torch.rand(T, 2))
    with pytest.raises(ValueError, match=r"records have different shapes .*monitor.records\[''\]\['spike'\]"):
        mon.sequence("")
    assert torch.allclose(mon.firing_rate(""), torch.cat([r.flatten() for r in mon.records[""]["spike"]]).mean())


# -- bad arguments -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"names": ["9"]}, ValueError, r"^names: '9' is not a layer of type Neuron in net \(layers: '1', '3'\)"),
    ({"instance": nn.ReLU}, ValueError, r"^instance: net has no layer of type ReLU"),
    ({"states": ("u",)}, ValueError, r"^states: 'u' is not a state of layer '1' \(states: v\)"),
    ({"states": "v"}, ValueError, r"^states: expected 'membrane', 'all' or a sequence .*states=\('v',\)"),
    ({"states": (), "spikes": False}, ValueError, r"^states, spikes: nothing to record"),
    ({"max_bytes": 0}, ValueError, r"^max_bytes: expected an int > 0 or None, got 0"),
    ({"max_records": 2.5}, ValueError, r"^max_records: "),
    ({"instance": 3}, TypeError, r"^instance: expected a class or a tuple of classes, got 3"),  # was isinstance's
    ({"instance": ()}, TypeError, r"^instance: expected a class or a tuple of classes, got \(\)"),
])
def test_bad_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Monitor(net_of("s"), **kwargs)


@pytest.mark.parametrize(("name", "value"), [("max_bytes", -1), ("max_records", 2.5), ("max_records", True)])
def test_caps_set_after_construction_are_checked_and_read(name: str, value: object) -> None:
    """A cap set on a built monitor: refused as the constructor refuses it (a negative one was taken, and made the
    monitor full at once), and read by the next call."""
    net = net_of("m")
    mon = Monitor(net)
    with pytest.raises(ValueError, match=f"^{name}: expected an int > 0 or None"):
        setattr(mon, name, value)
    assert getattr(mon, name) is None and not mon.full
    mon.max_records = 1
    with pytest.warns(MonitorFullWarning):
        net(torch.rand(3, 2, 4) * 3)
    assert mon.full


def test_unknown_layer_and_key_when_reading() -> None:
    net = net_of("s")
    mon = Monitor(net)
    with pytest.raises(KeyError, match="layer '7' is not monitored"):
        mon.sequence("7")
    with pytest.raises(KeyError, match="key 'w' is not recorded for layer '3'"):
        mon.sequence("3", "w")
    with pytest.raises(ValueError, match="nothing recorded yet"):
        mon.sequence("3")
    with pytest.raises(TypeError, match="^net: expected a torch.nn.Module"):
        Monitor([net])


# -- SpikingJelly ---------------------------------------------------------------------------------------------
@pytest.fixture
def sj(monkeypatch):
    """SpikingJelly's activation_based package; its monitor module imports tensorboard's SummaryWriter at import
    (only its GPUMonitor uses it), so a stand-in is put in place when tensorboard is not installed."""
    pytest.importorskip("spikingjelly")
    try:
        importlib.import_module("torch.utils.tensorboard")
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = object  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", stub)
        monkeypatch.delitem(sys.modules, "spikingjelly.activation_based.monitor", raising=False)
    return types.SimpleNamespace(**{name: importlib.import_module(f"spikingjelly.activation_based.{name}")
                                    for name in ("monitor", "functional", "neuron", "layer")})


def test_spikingjelly_output_monitor_on_our_layers(sj) -> None:
    monitor, functional = sj.monitor, sj.functional
    net = nn.Sequential(nn.Linear(4, 5), LIFNode(), nn.Linear(5, 3), IFNode())
    functional.set_step_mode(net, "m")
    rates = monitor.OutputMonitor(net, instance=LIFNode, function_on_output=lambda s: s.mean())
    outputs = monitor.OutputMonitor(net, instance=(LIFNode, IFNode))
    x = inputs()
    out = net(x)
    assert rates.monitored_layers == ["1"] and len(rates.records) == 1
    assert outputs.monitored_layers == ["1", "3"] and torch.equal(outputs["3"][0], out)
    functional.reset_net(net)
    assert net[1].v == 0.0
    rates.close()
    outputs.close()


def test_spikingjelly_attribute_monitor_reads_v_and_v_seq(sj) -> None:
    monitor = sj.monitor
    single = nn.Sequential(nn.Linear(4, 5), LIFNode())
    with monitor.AttributeMonitor("v", pre_forward=False, net=single, instance=LIFNode) as v_mon:
        run_single(single, inputs())
    assert len(v_mon["1"]) == T and v_mon["1"][-1].shape == (B, 5)
    multi = nn.Sequential(nn.Linear(4, 5), LIFNode(step_mode="m", store_v_seq=True))
    with monitor.AttributeMonitor("v_seq", pre_forward=False, net=multi, instance=LIFNode) as seq_mon:
        multi(inputs())
    assert seq_mon["1"][0].shape == (T, B, 5)
    assert torch.equal(seq_mon["1"][0][-1], multi[1].v)


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_our_monitor_on_a_spikingjelly_net(sj, step_mode: str) -> None:
    neuron, layer = sj.neuron, sj.layer
    net = nn.Sequential(layer.Linear(4, 5, step_mode=step_mode), neuron.LIFNode(step_mode=step_mode))
    x = inputs()
    with Monitor(net, instance=neuron.BaseNode) as mon:
        out = net(x) if step_mode == "m" else run_single(net, x)
        assert net[1].store_v_seq is False  # on for each call in step mode 'm' only, off after it
    assert net[1].store_v_seq is False
    assert torch.equal(mon.sequence("1"), out.detach())
    assert mon.sequence("1", "v").shape == (T, B, 5)
    assert torch.equal(mon.sequence("1", "v")[-1], net[1].v)


# -- progress bars ---------------------------------------------------------------------------------------------
def test_progress_returns_the_iterable_itself_when_no_bar_is_shown(monkeypatch) -> None:
    from autocuda.base.progress import enabled, progress

    items = [1, 2, 3]
    monkeypatch.delenv("AUTOCUDA_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert not enabled() and progress(items, desc="x", total=3) is items
    monkeypatch.setenv("AUTOCUDA_PROGRESS", "1")
    assert progress(items, disable=True) is items
    monkeypatch.setenv("AUTOCUDA_PROGRESS", "0")
    assert progress(items) is items
    monkeypatch.setenv("AUTOCUDA_PROGRESS", "1")
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed: the plain bar, the same items
    assert enabled() and progress(items) is not items and list(progress(items)) == items


def test_progress_draws_with_tqdm_when_asked(monkeypatch, capsys) -> None:
    pytest.importorskip("tqdm")
    from autocuda.base.progress import enabled, progress

    monkeypatch.setenv("AUTOCUDA_PROGRESS", "1")
    assert enabled()
    bar = progress(iter([1, 2, 3]), desc="specs", total=3)
    assert not isinstance(bar, list) and list(bar) == [1, 2, 3]
    assert "specs" in capsys.readouterr().err
    monkeypatch.setenv("AUTOCUDA_PROGRESS", "maybe")
    with pytest.raises(ValueError, match=r"^AUTOCUDA_PROGRESS: expected 0 or 1"):
        enabled()
