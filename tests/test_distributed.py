"""DistributedDataParallel on CPU processes: two processes under torchrun, gloo averaging the gradients, the
neurons on the host runner (the generated kernels compiled for the CPU), give the gradients and outputs of one
process over the whole batch. The same script over two GPUs with NCCL is a GPU test (tests/gpu)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autocuda.host import toolchain

REPO = Path(__file__).resolve().parents[1]
DDP_SCRIPT = REPO / "tests" / "gpu" / "ddp_step.py"


HOST_MISSING = toolchain.missing()


def _load_ddp_script():
    spec = importlib.util.spec_from_file_location("ddp_step", DDP_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(HOST_MISSING is not None, reason=f"host runner unavailable: {HOST_MISSING}")
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_over_two_cpu_processes_gives_the_single_process_gradients(tmp_path):
    """The single process's step runs first, here: the processes then find its host kernels in this process's cache
    (their shares of the batch get the same kernels: the layout rule picks the same for either size), so they
    load them instead of each compiling them again; what is compared is the same."""
    from autocuda import store

    script = _load_ddp_script()
    single = script.single_process_step(torch.device("cpu"), backend="host")
    outfile = tmp_path / "ddp_grads.pt"
    # AUTOCUDA_NATIVE=0: see test_store's warm-cache test (a fresh cache would start a native build per process)
    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(store.root()), "OMP_NUM_THREADS": "1", "AUTOCUDA_NATIVE": "0",
                        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(DDP_SCRIPT), str(outfile), "--cpu"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    ddp = torch.load(outfile)
    assert ddp["world_size"] == 2
    script.check_against_single_process(ddp, single)
