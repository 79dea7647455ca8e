"""DistributedDataParallel's options on CPU processes (gloo, two ranks, the neurons on the host runner): each gives
the single process's gradients and parameters, or is what torch does for any layer. A network of LIFNode, a Neuron
with a learnable per-channel tau ([C, 1]), ParametricLIFNode and PSN under broadcast_buffers=False,
find_unused_parameters, static_graph, gradient_as_bucket_view, no_sync() over two micro-batches, states carried
between iterations, the layers' own recompute and torch.utils.checkpoint; a fused BatchNorm (`BatchNormNeuron`)
against the unfused pair under DDP (per-process statistics, as torch's BatchNorm under DDP), with
`SyncBatchNorm.convert_sync_batchnorm`'s reach; a learned tensor that is no nn.Parameter (a buffer, whose gradient
DDP leaves as each process's own: docs/distributed.md says so).

Run as a script, this file is one rank: `python tests/test_data_parallel_edges.py OUTDIR BACKEND CASE,CASE...`
(WORLD_SIZE, RANK and the rendezvous in the environment, as `test_distributed.run_ranks` sets them); each case's
results go to OUTDIR/CASE_RANK.pt.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autocuda import nn as ann

REPO = Path(__file__).resolve().parents[1]
T, B, F, H, C, L, OUT = 4, 4, 6, 8, 3, 2, 3


# ---- the networks ------------------------------------------------------------------------------------

def network(backend: str, recompute: bool = False) -> nn.Module:
    """Linear -> LIF -> Linear -> Neuron(tau [C, 1] learned) -> Linear -> PLIF -> Linear -> PSN, every layer firing."""
    torch.manual_seed(0)
    tau = nn.Parameter(torch.tensor([[2.0], [2.5], [3.0]]))
    model = nn.Sequential(nn.Linear(F, H), ann.LIFNode(step_mode="m", backend=backend), nn.Linear(H, C * L),
                          nn.Unflatten(2, (C, L)), ann.Neuron("lif", step_mode="m", backend=backend, tau=tau),
                          nn.Flatten(2), nn.Linear(C * L, 6),
                          ann.ParametricLIFNode(init_tau=2.0, step_mode="m", backend=backend), nn.Linear(6, OUT),
                          ann.PSN(T))
    for layer, high in ((model[0], 0.6), (model[2], 1.2), (model[6], 1.5)):
        nn.init.uniform_(layer.weight, -0.1, high)
    for module in model.modules():
        if isinstance(module, ann.Neuron):
            module.recompute = recompute
    return model


class Block(nn.Module):
    """BatchNorm1d over T, B and L (T folded into the batch), then a neuron with a learned per-channel tau."""

    def __init__(self, backend: str):
        super().__init__()
        self.bn = nn.BatchNorm1d(C)
        self.neuron = ann.Neuron("lif", step_mode="m", backend=backend, tau=nn.Parameter(torch.full((C, 1), 2.0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.neuron(self.bn(x.flatten(0, 1)).reshape(x.shape))


def bn_network(backend: str, fused: bool) -> nn.Module:
    """Linear -> Block (fused into a BatchNormNeuron where `fused`) -> Linear -> PLIF."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(F, C * L), nn.Unflatten(2, (C, L)), Block(backend), nn.Flatten(2),
                          nn.Linear(C * L, OUT), ann.ParametricLIFNode(init_tau=2.0, step_mode="m", backend=backend))
    nn.init.uniform_(model[0].weight, -0.1, 0.4)
    nn.init.uniform_(model[4].weight, -0.1, 1.5)
    with torch.no_grad():
        model[2].bn.weight.uniform_(0.5, 1.5)
        model[2].bn.bias.uniform_(0.2, 0.8)
    if fused:
        ann.fuse_batchnorm(model, pairs=[("bn", "neuron")])
        assert isinstance(model[2].neuron, ann.BatchNormNeuron)
    return model


class Checkpointed(nn.Module):
    """torch.utils.checkpoint around `inner`, its layers reset inside (the recomputation then starts where the first
    run did: docs/bad-input.md)."""

    def __init__(self, inner: nn.Module, reentrant: bool):
        super().__init__()
        self.inner, self.reentrant = inner, reentrant

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        reset(self.inner)
        return self.inner(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self._run, x, use_reentrant=self.reentrant)


def checkpointed_network(backend: str, reentrant: bool) -> nn.Module:
    """`network`, its layers 1 to 4 (LIF, Linear, Unflatten, the per-channel Neuron) checkpointed; the same
    parameter names as `network`'s once `_plain_names` maps them."""
    inner = network(backend)
    return nn.Sequential(inner[0], Checkpointed(nn.Sequential(*inner[1:5]), reentrant), *inner[5:])


def _plain_names(name: str) -> str:
    prefix = "1.inner."
    if name.startswith(prefix):
        index, rest = name[len(prefix):].split(".", 1)
        return f"{int(index) + 1}.{rest}"
    return name


# ---- training ----------------------------------------------------------------------------------------

def reset(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, ann.Neuron):
            module.reset()


def batch(seed: int, outputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(T, B, F, generator=g) * 2, torch.rand(T, B, outputs, generator=g)


def share(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's part of the batch (dim 1); all of it in a single process (world 1)."""
    size = x.shape[1] // world
    return x[:, rank * size:(rank + 1) * size].contiguous()


def train(model: nn.Module, rank: int, world: int, *, outputs: int, iters: int = 2, carried: bool = False,
          micro: int = 1) -> dict[str, Any]:
    """`iters` SGD steps on seeded batches; the layers reset before each forward (or, `carried`, their states
    kept, detached);
    `micro` micro-batches a step, all but the last under DDP's no_sync(). The last step's gradients and the state
    dict after it."""
    inner = getattr(model, "module", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    grads: dict[str, Any] = {}
    for it in range(iters):
        optimizer.zero_grad()
        x, y = (share(t, rank, world) for t in batch(10 + it, outputs))
        size = x.shape[1] // micro
        for k in range(micro):
            if not carried:  # each micro-batch a sequence of its own
                reset(model)
            quiet = k < micro - 1 and isinstance(model, DistributedDataParallel)
            with model.no_sync() if quiet else contextlib.nullcontext():
                part = slice(k * size, (k + 1) * size)
                out = model(x[:, part])
                (nn.functional.mse_loss(out, y[:, part]) / micro).backward()
        if carried:
            for module in model.modules():
                if isinstance(module, ann.Neuron):
                    module.detach()
        grads = {_plain_names(n): None if p.grad is None else p.grad.clone() for n, p in inner.named_parameters()}
        optimizer.step()
    state = {_plain_names(n): v.clone() for n, v in inner.state_dict().items()}
    return {"grads": grads, "state": state}


def _ddp(model: nn.Module, world: int, options: dict[str, Any]) -> nn.Module:
    return DistributedDataParallel(model, **options) if world > 1 else model


def _case(build: Callable[[str], nn.Module], options: dict[str, Any] | None = None, **how: Any
          ) -> Callable[[int, int, str], dict[str, Any]]:
    def run(rank: int, world: int, backend: str) -> dict[str, Any]:
        return train(_ddp(build(backend), world, options or {}), rank, world, outputs=OUT, **how)
    return run


def _learned_buffer(rank: int, world: int, backend: str) -> dict[str, Any]:
    """The per-channel tau as a plain tensor requiring grad (a buffer, learned as SpikingJelly's are), one step."""
    model = network(backend)
    tau = model[4].tau.detach().clone().requires_grad_()
    del model[4].tau
    model[4].tau = tau
    ddp = _ddp(model, world, {})
    x, y = (share(t, rank, world) for t in batch(10, OUT))
    nn.functional.mse_loss(ddp(x), y).backward()
    return {"grads": {"4.tau": tau.grad.clone()}, "state": {}}


CASES: dict[str, Callable[[int, int, str], dict[str, Any]]] = {
    "default": _case(network),
    "no_broadcast_buffers": _case(network, {"broadcast_buffers": False}),
    "find_unused_parameters": _case(network, {"find_unused_parameters": True}),
    "static_graph": _case(network, {"static_graph": True}, iters=3),
    "gradient_as_bucket_view": _case(network, {"gradient_as_bucket_view": True}),
    "no_sync": _case(network, micro=2),
    "carried_states": _case(network, carried=True, iters=3),
    "recompute": _case(lambda b: network(b, recompute=True), {"find_unused_parameters": True}),
    "checkpoint": _case(lambda b: checkpointed_network(b, False)),
    "checkpoint_reentrant": _case(lambda b: checkpointed_network(b, True), {"static_graph": True}),
    "learned_buffer": _learned_buffer,
}
for _fused in (False, True):
    _kind = "fused" if _fused else "unfused"
    CASES |= {
        f"bn_{_kind}": _case(lambda b, f=_fused: bn_network(b, f)),
        f"bn_{_kind}_no_broadcast": _case(lambda b, f=_fused: bn_network(b, f), {"broadcast_buffers": False}),
        f"bn_{_kind}_static": _case(lambda b, f=_fused: bn_network(b, f), {"static_graph": True,
                                                                         "find_unused_parameters": True}, iters=3),
        f"bn_{_kind}_no_sync": _case(lambda b, f=_fused: bn_network(b, f), {"gradient_as_bucket_view": True},
                                     micro=2),
    }
DDP_CASES = ("default", "no_broadcast_buffers", "find_unused_parameters", "static_graph", "gradient_as_bucket_view",
             "no_sync", "carried_states", "recompute", "checkpoint", "checkpoint_reentrant")
BN_CASES = ("bn_{}", "bn_{}_no_broadcast", "bn_{}_static", "bn_{}_no_sync")


def _rank_main(outdir: str, backend: str, cases: list[str]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        torch.save(CASES[case](rank, world, backend), os.path.join(outdir, f"{case}_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


# ---- the tests ---------------------------------------------------------------------------------------

def _ranks(tmp_path: Path, backend: str, cases: list[str]) -> list[dict[str, dict[str, Any]]]:
    """Each rank's results of `cases`, by case (two gloo ranks running this file)."""
    import python_children  # noqa: F401  (the ranks are its children: see test_distributed.run_ranks)
    from test_distributed import run_ranks

    from autocuda.toolchain import store

    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(store.root()), "OMP_NUM_THREADS": "1", "AUTOCUDA_NATIVE": "0",
                        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = run_ranks([__file__, str(tmp_path), backend, ",".join(cases)], 2, env, timeout=60)
    for rank, result in enumerate(done):
        assert result.returncode == 0, f"rank {rank} failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return [{case: torch.load(tmp_path / f"{case}_{rank}.pt") for case in cases} for rank in range(2)]


def _close(got: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert got.keys() == expected.keys(), what
    for name, value in expected.items():
        assert (got[name] is None) == (value is None), f"{what}: {name}"
        if value is not None:
            scale = float(value.abs().max()) if value.is_floating_point() else 0.0
            torch.testing.assert_close(got[name].double(), value.double(), rtol=1e-5, atol=1e-6 * scale + 1e-9,
                                       msg=lambda m, name=name: f"{what}: {name}: {m}")


def _host_missing() -> str | None:
    from autocuda.toolchain.host import cxx

    return cxx.missing()


NEEDS_DDP = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
             pytest.mark.skipif(_host_missing() is not None, reason="host runner unavailable")]


def _profile() -> str:
    from conftest import profile

    return profile()


# Two-process sweeps of DDP's options: in the slow profile (tests/test_distributed.py trains under DDP by default)
SWEEP = pytest.mark.skipif(_profile() != "slow", reason="a two-process sweep of DDP's options: runs with --slow")


@pytest.mark.parametrize("backend", ["host", "reference"])
@SWEEP
@NEEDS_DDP[0]
@NEEDS_DDP[1]
def test_ddp_options_give_the_single_process_results(tmp_path, backend):
    """Every DDP option, no_sync, carried states and both checkpointings: the averaged gradients and the parameters
    after the steps equal one process's over the whole batch, on both ranks (the single steps run here first, so
    the ranks find the kernels in the cache)."""
    single = {case: CASES[case](0, 1, backend) for case in DDP_CASES}
    assert all(g is not None and g.abs().sum() > 0 for g in single["default"]["grads"].values())
    for rank, results in enumerate(_ranks(tmp_path, backend, list(DDP_CASES))):
        for case in DDP_CASES:
            for part in ("grads", "state"):
                _close(results[case][part], single[case][part], f"{case}, rank {rank}, {part}")


@SWEEP
@NEEDS_DDP[0]
@NEEDS_DDP[1]
def test_ddp_of_a_fused_batchnorm_equals_the_unfused_pair_under_ddp(tmp_path):
    """Statistics are each process's, as torch's BatchNorm's under DDP (not the whole batch's: SyncBatchNorm would
    sync them, and convert_sync_batchnorm leaves a BatchNormNeuron as it is); the fused layer's gradients and
    running statistics equal the unfused pair's on each rank. A learned tensor that is no nn.Parameter is a buffer:
    its gradient is each process's own, not the average (docs/distributed.md)."""
    cases = [c.format(kind) for c in BN_CASES for kind in ("fused", "unfused")] + ["learned_buffer"]
    for _case_name in cases:  # the kernels into the cache before the ranks start
        if _case_name.startswith("bn_") and not _case_name.endswith("_no_sync"):
            CASES[_case_name](0, 1, "host")
    single_buffer = CASES["learned_buffer"](0, 1, "host")["grads"]["4.tau"]
    ranks = _ranks(tmp_path, "host", cases)
    fused_names = {"2.neuron.neuron.tau": "2.neuron.tau"} | {
        f"2.neuron.{n}": f"2.bn.{n}" for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    for rank, results in enumerate(ranks):
        for case in BN_CASES:
            fused, unfused = results[case.format("fused")], results[case.format("unfused")]
            for part in ("grads", "state"):
                renamed = {fused_names.get(n, n): v for n, v in fused[part].items()}
                _close(renamed, unfused[part], f"{case.format('')}, rank {rank}, {part}")
    first, second = (r["learned_buffer"]["grads"]["4.tau"] for r in ranks)
    assert not torch.allclose(first, second), "the buffer's gradients were averaged"
    torch.testing.assert_close((first + second) / 2, single_buffer, rtol=1e-5, atol=1e-9)


def test_convert_sync_batchnorm_leaves_a_batchnorm_neuron_and_fuse_leaves_a_sync_batchnorm():
    """SyncBatchNorm.convert_sync_batchnorm converts torch BatchNorms only: a BatchNormNeuron (no torch BatchNorm)
    stays as it is, its statistics each process's; converted first, the SyncBatchNorm is not fused, with the reason
    (docs/batchnorm.md)."""
    fused = nn.SyncBatchNorm.convert_sync_batchnorm(bn_network("reference", True))
    assert isinstance(fused[2].neuron, ann.BatchNormNeuron)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in fused.modules())
    unfused = nn.SyncBatchNorm.convert_sync_batchnorm(bn_network("reference", False))
    assert isinstance(unfused[2].bn, nn.SyncBatchNorm)
    (finding,) = ann.batchnorm_fusions(unfused, pairs=[("bn", "neuron")])
    assert not finding.fused and "SyncBatchNorm" in finding.reason
    assert ann.fuse_batchnorm(unfused, pairs=[("bn", "neuron")])[2].bn is unfused[2].bn


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
    # as tests/gpu/ddp_step.py: gloo can abort in the interpreter's shutdown after the results are written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
