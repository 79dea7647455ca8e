"""A noisy LIF against LIF in the tree this runs from (`noise_floor.sh` runs it in four variant trees)."""
import sys

import torch

from autocuda.spec.load import load_spec, spec_from_toml
from bench import noise as bn
from bench.measure import Clock

label = sys.argv[1]
clock = Clock(torch.device("cuda"), False)
specs = {"lif": load_spec("lif"), "noisy_lif": spec_from_toml(bn.NOISY_LIF)}
for dtype in (torch.float32, torch.bfloat16):
    for training in (False, True):
        t = {n: clock.median(bn.layer_call(s, dtype, 8, 8 << 20, training)) for n, s in specs.items()}
        print(label, str(dtype)[6:], "training " if training else "inference", f"lif {t['lif']:.4f}",
              f"noisy {t['noisy_lif']:.4f}", f"ratio {t['noisy_lif'] / t['lif']:.3f}", flush=True)
