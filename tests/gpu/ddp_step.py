"""One DistributedDataParallel training step of a small spiking network, for tests and docs/distributed.md.

    torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_step.py OUTFILE [--cpu]

Every process takes one GPU (its LOCAL_RANK) and its share of a fixed, seeded batch (split along the batch
dimension, dim 1 of [T, B, features]); DDP averages the parameter gradients over the processes through NCCL.
With `--cpu`, the processes run on the CPU, their neurons on the host runner (the generated kernels compiled for
the CPU), and DDP averages through gloo. Rank 0 saves the gradients, with the gathered outputs of the whole batch,
to OUTFILE (torch.save of a dict). `single_process_step` computes the same in one process from the whole batch:
the gradients must agree.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

from autocuda import nn as ann

STEPS, BATCH, FEATURES, HIDDEN, OUTPUTS = 6, 8, 16, 32, 8


def build_model(backend: str | None = None) -> nn.Module:
    """Linear -> LIF -> Linear -> ParametricLIF (a learnable decay), the same initial weights in every process."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), ann.LIFNode(step_mode="m", backend=backend), nn.Linear(
        HIDDEN, OUTPUTS), ann.ParametricLIFNode(init_tau=3.0, step_mode="m", backend=backend))
    for layer in (model[0], model[2]):  # enough drive for both neuron layers to fire
        nn.init.uniform_(layer.weight, -0.1, 0.3)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch on the CPU: inputs [T, B, FEATURES] and targets [T, B, OUTPUTS]."""
    g = torch.Generator().manual_seed(1)
    return torch.rand(STEPS, BATCH, FEATURES, generator=g) * 2, torch.rand(STEPS, BATCH, OUTPUTS, generator=g)


def reset_states(model: nn.Module) -> None:
    """What spikingjelly's functional.reset_net does: every neuron layer back to its initial state. Needed before
    each new sequence (and whenever the batch size changes), in every process."""
    for module in model.modules():
        if isinstance(module, ann.Neuron):
            module.reset()


def step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One step: fresh states, forward over the sequence, mean squared error, backward. Returns the output."""
    reset_states(model)
    out = model(x)
    nn.functional.mse_loss(out, target).backward()  # a mean: the average of the processes' means is the whole's
    return out.detach()


def single_process_step(device: torch.device, backend: str | None = None) -> dict:
    """The same step in one process from the whole batch: {'grads': {name: grad}, 'output': [T, B, OUTPUTS]}."""
    model = build_model(backend).to(device)
    x, target = batch()
    out = step(model, x.to(device), target.to(device))
    return {"grads": {n: p.grad.detach().cpu() for n, p in model.named_parameters()}, "output": out.cpu()}


def check_against_single_process(ddp: dict, single: dict) -> None:
    """The processes' gathered outputs equal the single process's, and their averaged gradients its gradients
    (every one nonzero) within float rounding; the output layer fires, but not everywhere."""
    assert single["output"].sum() > 0 and 0 < (single["output"] == 0).sum()
    assert torch.equal(ddp["output"], single["output"]), "the processes' outputs differ from the single process's"
    assert ddp["grads"].keys() == single["grads"].keys()
    for name, grad in single["grads"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(ddp["grads"][name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()),
                                   msg=lambda m, name=name: f"{name}: {m}")


def _process_group(on_cpu: bool) -> tuple[torch.device, str | None, list[int] | None]:
    """This process's device, neuron backend and DDP device ids, the process group started."""
    import torch.distributed as dist

    if on_cpu:
        dist.init_process_group("gloo")
        return torch.device("cpu"), "host", None
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # before anything touches CUDA: NCCL and the kernels use this GPU
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    return device, None, [local_rank]


def main(outfile: str, on_cpu: bool = False) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    device, backend, device_ids = _process_group(on_cpu)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert BATCH % world == 0, f"the batch of {BATCH} does not split over {world} processes"
    model = DistributedDataParallel(build_model(backend).to(device), device_ids=device_ids)
    x, target = batch()
    share = BATCH // world
    mine = slice(rank * share, (rank + 1) * share)
    out = step(model, x[:, mine].contiguous().to(device), target[:, mine].contiguous().to(device))
    outputs = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(outputs, out)
    if rank == 0:
        grads = {n: p.grad.detach().cpu() for n, p in model.module.named_parameters()}
        torch.save({"grads": grads, "output": torch.cat(outputs, dim=1).cpu(), "world_size": world}, outfile)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--cpu"]):
        sys.exit("usage: torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_step.py OUTFILE [--cpu]")
    main(sys.argv[1], on_cpu=sys.argv[2:] == ["--cpu"])
    # torch's DDP over gloo can abort in the interpreter's shutdown after all of the above has finished ("terminate
    # called without an active exception", on a loaded machine, with no autocuda code involved): the results are
    # written and the process group is destroyed, so the process leaves without that shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
