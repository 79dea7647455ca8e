"""The random sequences of `tests/test_layer_sequences.py` on CUDA: a layer on the CUDA backend (its programs,
keyed calls, bound launches and native plans, the default path of a user's training loop) against its reference
twin, every output, state and gradient compared after every call."""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_layer_sequences import CLASSES, MORE_CLASSES, _run  # noqa: E402 - the core of the CPU test, shared


@pytest.mark.parametrize("name", CLASSES + MORE_CLASSES)
def test_a_layer_changed_between_calls_on_cuda_computes_what_its_reference_twin_does(name: str) -> None:
    for seed in range(6):  # fewer than the CPU test's --slow: each class's kernels compile with NVRTC as reached
        _run(name, seed, 80, backend="cuda")
