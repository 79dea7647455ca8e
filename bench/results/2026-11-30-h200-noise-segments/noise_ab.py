"""A noisy LIF against LIF and the generator alone, in the tree this runs from (`noise_ab.sh` alternates two)."""
import sys

import torch

from autocuda.codegen import noise
from autocuda.spec.load import load_spec, spec_from_toml
from bench import noise as bn
from bench.measure import Clock

label = sys.argv[1]
clock = Clock(torch.device("cuda"), False)
count = 64 << 20
for precision in ("float", "double"):
    kernel = noise.DrawKernel("normal", precision)
    out = torch.empty(count, dtype=noise.PRECISIONS[precision].torch_dtype, device="cuda")
    ms = clock.median(lambda kernel=kernel, out=out: kernel.simple_call(out=out, seed_lo=1, seed_hi=2, site=0,
                                                                        neuron0=0, step=0))
    print(label, "generator normal", precision, f"{ms:.4f} ms", f"{count / ms / 1e6:.1f} G/s", flush=True)
specs = {"lif": load_spec("lif"), "noisy_lif": spec_from_toml(bn.NOISY_LIF)}
for dtype in (torch.float32, torch.bfloat16, torch.float64):
    for training in (False, True):
        t = {n: clock.median(bn.layer_call(s, dtype, 8, 8 << 20, training)) for n, s in specs.items()}
        print(label, "layer", dtype, "training" if training else "inference", f"lif {t['lif']:.4f}",
              f"noisy {t['noisy_lif']:.4f}", f"ratio {t['noisy_lif'] / t['lif']:.3f}", flush=True)
