"""The NIR MLP's training step (bench/nir_mlp.py) for four neuron layers in one process, fp32 and TF32:
ours, SpikingJelly 2.0's NIR import, and two floors — the same graph with each neuron replaced by a bare
torch.autograd.Function that only allocates its outputs (the least any fused neuron op can cost on host and
GPU), and by torch.relu. Step time by CUDA events (steps back to back), host time of the step call; three
rounds, systems alternating. Writes ceiling.json next to --out."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import nir_mlp  # noqa: E402
from floors import BareNeuron, Relu, swap_neurons  # noqa: E402


def timed(model, x, y, steps=30, warmup=5):
    step = nir_mlp.step_function(model, x, y, __import__("contextlib").nullcontext, False)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    host = []
    for a, b in events:
        a.record()
        s = time.perf_counter()
        step()
        host.append(1e3 * (time.perf_counter() - s))
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events), statistics.median(host)


def main():
    out = Path(sys.argv[1])
    device = torch.device("cuda")
    torch.manual_seed(0)
    graph = nir_mlp.make_graph(1024)
    x = torch.rand(32, 256, 784, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    builders = {"ours": lambda: nir_mlp.build("ours", graph, device),
                "sj-nir": lambda: nir_mlp.build("sj-nir", graph, device),
                "bare neuron": lambda: swap_neurons(nir_mlp.build("ours", graph, device), BareNeuron),
                "relu": lambda: swap_neurons(nir_mlp.build("ours", graph, device), Relu)}
    rows = []
    for precision in ("fp32", "tf32"):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        for rnd in range(3):
            for name, build in builders.items():
                step_ms, host_ms = timed(build(), x, y)
                rows.append({"precision": precision, "round": rnd, "system": name, "step_ms": step_ms,
                             "host_ms": host_ms})
    print(torch.cuda.get_device_name(), torch.__version__)
    print(f"{'precision':9} {'system':12} {'step ms (3 rounds)':>26} {'host ms (3 rounds)':>26} {'sj / this':>16}")
    for precision in ("fp32", "tf32"):
        for name in builders:
            mine = [r for r in rows if r["precision"] == precision and r["system"] == name]
            sj = [r for r in rows if r["precision"] == precision and r["system"] == "sj-nir"]
            ratios = [s["step_ms"] / m["step_ms"] for s, m in zip(sj, mine)]
            print(f"{precision:9} {name:12} {' '.join(f'{r['step_ms']:8.3f}' for r in mine)} "
                  f"{' '.join(f'{r['host_ms']:8.3f}' for r in mine)} {' '.join(f'{q:5.2f}' for q in ratios)}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ceiling.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                  "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
