"""Outputs of every shipped spec of one input step (4 dtypes, 2 reset rules, T=6, N=37: spikes, final states, state
sequences and the input gradient) on the host runner compiled with the flags of argv[1], saved to argv[2]. Run
each set of flags with its own AUTOCUDA_CACHE_DIR; host_flags_compare.py compares two such files bitwise.
argv[3], where given, replaces the link's libraries (`cxx.LINK`; "" for the compiler's default link).

    python host_flags_outputs.py "-std=c++17 -O2 -shared -fPIC -fvisibility=hidden -ffp-contract=off" o2.pt ""
"""
from __future__ import annotations

import sys
import zlib

import torch

from autocuda.toolchain.host import cxx


def outputs() -> dict:
    import autocuda.functional as F

    from autocuda.spec.load import list_specs, load_spec
    from autocuda.spec.model import reset_rules

    results: dict = {}
    for name, _ in list_specs():
        spec = load_spec(name)
        if len(spec.inputs) != 1:
            continue
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for reset in reset_rules(spec)[:2]:
                generator = torch.Generator().manual_seed(zlib.crc32(f"{name} {dtype} {reset}".encode()))
                x = torch.randn(6, 37, generator=generator, dtype=torch.float64) * 1.5 + 0.6
                x = x.to(dtype).requires_grad_(True)
                torch.manual_seed(zlib.crc32(name.encode()))  # the seed of a spec that draws
                try:
                    spikes, finals, seqs = F.multi_step(name, x, backend="host", reset=reset, store_state_seq=True)
                except (TypeError, ValueError) as error:  # a spec that needs more (a draw's seed, ...)
                    results[(name, str(dtype), reset)] = repr(error)[:200]
                    continue
                tensors = [spikes, *(finals or ()), *(seqs or ())]
                weights = [torch.linspace(0.3, 1.7, t.numel(), dtype=torch.float64).view(t.shape) for t in tensors]
                loss = sum((t.double() * w).sum() for t, w in zip(tensors, weights) if t.requires_grad)
                grad = torch.autograd.grad(loss, x)[0] if isinstance(loss, torch.Tensor) else None
                results[(name, str(dtype), reset)] = [t.detach().clone() for t in tensors] + [grad]
    return results


if __name__ == "__main__":
    cxx.CXX_FLAGS = tuple(sys.argv[1].split())
    if len(sys.argv) > 3:
        cxx.LINK = tuple(sys.argv[3].split())
    cxx._identity.cache_clear()
    found = outputs()
    torch.save(found, sys.argv[2])
    print(len(found), "configurations")
