"""Where the host's time goes in one training step of the NIR MLP (bench/nir_mlp.py), and whether any of it
waits for the GPU.

For each system: (1) the step under torch.cuda.set_sync_debug_mode("warn") — every synchronising call warns;
(2) the host time of each phase (reset+zero_grad, forward+loss, backward, optimizer) measured twice: with the
GPU idle, and with the GPU held busy by a long torch.cuda._sleep queued first, so that a phase that waits for
the GPU shows the sleep, and one that does not shows only its own host cost.
"""
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import nir_mlp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import phases  # noqa: E402


def main():
    device = torch.device("cuda")
    torch.manual_seed(0)
    graph = nir_mlp.make_graph(1024)
    x = torch.rand(32, 256, 784, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    print(torch.cuda.get_device_name(), torch.__version__)
    for system in sys.argv[1].split(","):
        model = nir_mlp.build(system, graph, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(5):
            phases(model, optimizer, x, y)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            phases(model, optimizer, x, y)
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        print(f"== {system}: {len(caught)} synchronising calls in one step")
        for w in caught[:10]:
            print("   ", str(w.message)[:200], w.filename, w.lineno)
        for busy in (False, True):
            rows = []
            for _ in range(20):
                torch.cuda.synchronize()
                if busy:
                    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time
                rows.append(phases(model, optimizer, x, y))
            torch.cuda.synchronize()
            med = [statistics.median(c) for c in zip(*rows)]
            print(f"   gpu {'busy' if busy else 'idle'}: reset {med[0]:8.1f}  fwd+loss {med[1]:8.1f}  "
                  f"backward {med[2]:8.1f}  optim {med[3]:8.1f}  total {sum(med):8.1f} us")
        # back-to-back steps: event time per step vs host time per step
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
        host = []
        for a, b in events:
            a.record()
            s = time.perf_counter()
            phases(model, optimizer, x, y)
            host.append(1e3 * (time.perf_counter() - s))
            b.record()
        torch.cuda.synchronize()
        print(f"   back to back: step {statistics.median(a.elapsed_time(b) for a, b in events):.3f} ms, "
              f"host {statistics.median(host):.3f} ms")


main()
