"""Host time of one NIR-MLP training step (bench/nir_mlp.py's model) against two floors measured in the same
process: the same graph with each neuron replaced by (a) a bare torch.autograd.Function that only allocates its
outputs (spikes and the saved state forward, x's gradient backward: the least any fused neuron op can cost)
and (b) torch.relu (torch's own cheapest elementwise op). Also one neuron layer's call alone."""
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import nir_mlp  # noqa: E402


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        spikes, h = torch.empty_like(x), torch.empty_like(x)
        ctx.save_for_backward(h)
        return spikes

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad)


class BareNeuron(nn.Module):
    def forward(self, x):
        return Bare.apply(x)


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def swap_neurons(model, factory):
    nodes = model.nodes._modules
    for key, module in list(nodes.items()):
        if "LIF" in type(module).__name__ or hasattr(module, "spec"):
            nodes[key] = factory()
    return model


def phases(model, optimizer, x, y):
    t = [time.perf_counter()]
    nir_mlp._reset(model)
    optimizer.zero_grad(set_to_none=True)
    t.append(time.perf_counter())
    loss = nn.functional.cross_entropy(model(x).float().mean(0), y)
    t.append(time.perf_counter())
    loss.backward()
    t.append(time.perf_counter())
    optimizer.step()
    t.append(time.perf_counter())
    return [1e6 * (b - a) for a, b in zip(t, t[1:])]


def step_rows(name, model, x, y, repeats=40):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(5):
        phases(model, optimizer, x, y)
    rows = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        rows.append(phases(model, optimizer, x, y))
    torch.cuda.synchronize()
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"{name:10} reset {med[0]:7.1f}  fwd+loss {med[1]:7.1f}  backward {med[2]:7.1f}  optim {med[3]:7.1f}  "
          f"total {sum(med):7.1f} us")


def layer_call(name, layer, x, repeats=200):
    out = None
    for grad in (False, True):
        xs = x.detach().requires_grad_(grad)
        times = []
        for _ in range(repeats):
            if hasattr(layer, "reset"):
                layer.reset()
            torch.cuda.synchronize()
            s = time.perf_counter()
            out = layer(xs)
            if grad:
                out.backward(torch.ones_like(out))
            times.append(1e6 * (time.perf_counter() - s))
        print(f"{name:10} one layer {'fwd+bwd' if grad else 'fwd    '} {statistics.median(times):7.1f} us")
    return out


def main():
    device = torch.device("cuda")
    torch.manual_seed(0)
    graph = nir_mlp.make_graph(1024)
    x = torch.rand(32, 256, 784, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    print(torch.cuda.get_device_name(), torch.__version__)
    for rnd in range(0 if len(sys.argv) > 1 else 2):
        step_rows("ours", nir_mlp.build("ours", graph, device), x, y)
        step_rows("bare", swap_neurons(nir_mlp.build("ours", graph, device), BareNeuron), x, y)
        step_rows("relu", swap_neurons(nir_mlp.build("ours", graph, device), Relu), x, y)
        step_rows("sj-nir", nir_mlp.build("sj-nir", graph, device), x, y)
    h = torch.rand(32, 256, 1024, device=device)
    ours = nir_mlp.build("ours", graph, device)
    lif = next(m for m in ours.nodes._modules.values() if hasattr(m, "spec") or "LIF" in type(m).__name__)
    print("ours layer:", type(lif).__name__)
    layer_call("ours", lif, h)
    layer_call("bare", BareNeuron(), h)
    layer_call("relu", Relu(), h)
    sj = nir_mlp.build("sj-nir", graph, device)
    sjl = next(m for m in sj.modules() if "LIF" in type(m).__name__)
    layer_call("sj", sjl, h)
    if len(sys.argv) > 1:
        import cProfile
        import pstats
        optimizer = torch.optim.SGD(ours.parameters(), lr=1e-3)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            lif.reset()
            layer_call_once = lif(h.detach().requires_grad_(True))
            layer_call_once.backward(torch.ones_like(layer_call_once))
            lif.reset()
        prof.disable()
        with open(sys.argv[1], "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(45)
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(45)
        lif.reset()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                lif.reset()
                o = lif(h.detach().requires_grad_(True))
                o.backward(torch.ones_like(o))
            torch.cuda.synchronize()
        with open(sys.argv[1], "a") as f:
            f.write(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        del optimizer


if __name__ == "__main__":
    main()
