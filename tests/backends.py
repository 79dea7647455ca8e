"""What several test files share: the CPU backends a neuron is checked on (the reference, and the generated
kernels through the host runner where a C++ compiler is present), and the marker that skips a test needing the
host runner where it is missing."""
from __future__ import annotations

import pytest

from autocuda.toolchain.host import cxx as toolchain

NEEDS_HOST = pytest.mark.skipif(toolchain.missing() is not None, reason=f"host runner: {toolchain.missing()}")
CPU_BACKENDS = ["reference", pytest.param("host", marks=NEEDS_HOST)]
