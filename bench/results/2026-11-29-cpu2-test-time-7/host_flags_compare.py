"""Two files of host_flags_outputs.py compared bitwise: each tensor that differs, then the counts."""
from __future__ import annotations

import sys

import torch


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                              b.contiguous().view(-1).view(torch.uint8))


if __name__ == "__main__":
    first, second = torch.load(sys.argv[1]), torch.load(sys.argv[2])
    same = differ = skipped = 0
    for key, tensors in first.items():
        if isinstance(tensors, str) or isinstance(second[key], str):
            skipped += 1
            continue
        for a, b in zip(tensors, second[key]):
            if a is None:
                continue
            if same_bits(a, b):
                same += 1
            else:
                differ += 1
                print("differs:", key, float((a.double() - b.double()).abs().max()))
    print(f"bitwise equal {same}, different {differ}, configurations skipped {skipped}")
