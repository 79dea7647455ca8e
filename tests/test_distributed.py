"""DistributedDataParallel on CPU processes: two processes, gloo averaging the gradients, the neurons on the host
runner (the generated kernels compiled for the CPU), give the gradients and outputs of one process over the whole
batch. The same script over two GPUs with NCCL under torchrun is a GPU test (tests/gpu)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import python_children
import torch

from autocuda.toolchain.host import cxx as toolchain

REPO = Path(__file__).resolve().parents[1]
DDP_SCRIPT = REPO / "tests" / "gpu" / "ddp_step.py"


HOST_MISSING = toolchain.missing()


def run_ranks(command: list[str], world_size: int, env: dict[str, str], timeout: float = 600
              ) -> list[subprocess.CompletedProcess]:
    """Python with the arguments `command` run as each rank of a process group, as torchrun's workers are (RANK,
    WORLD_SIZE, LOCAL_RANK...), without torchrun's own process (another interpreter importing torch); the ranks are
    forked children (`python_children`). The group's rendezvous store is served
    here, on a port the system picks (TORCHELASTIC_USE_AGENT_STORE: the ranks connect to it, as to torchrun's);
    each rank has `timeout` seconds to end (subprocess.TimeoutExpired, the ranks killed)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    shared = env | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "WORLD_SIZE": str(world_size),
                    "LOCAL_WORLD_SIZE": str(world_size), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    ranks = [python_children.Child(command, shared | {"RANK": str(rank), "LOCAL_RANK": str(rank)}, REPO)
             for rank in range(world_size)]
    try:
        outputs = [rank.communicate(timeout=timeout) for rank in ranks]
        return [subprocess.CompletedProcess(rank.args, rank.returncode, *out) for rank, out in zip(ranks, outputs)]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
        del store


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
    from autocuda.toolchain import store

    script = _load_ddp_script()
    single = script.single_process_step(torch.device("cpu"), backend="host")
    outfile = tmp_path / "ddp_grads.pt"
    # AUTOCUDA_NATIVE=0: see test_store's warm-cache test (a fresh cache would start a native build per process)
    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(store.root()), "OMP_NUM_THREADS": "1", "AUTOCUDA_NATIVE": "0",
                        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for rank, done in enumerate(run_ranks([str(DDP_SCRIPT), str(outfile), "--cpu"], 2, env)):
        assert done.returncode == 0, f"rank {rank} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    ddp = torch.load(outfile)
    assert ddp["world_size"] == 2
    script.check_against_single_process(ddp, single)
