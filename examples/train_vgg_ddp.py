#!/usr/bin/env python
"""Train a spiking VGG on scikit-learn's 8x8 digits (no download) with DistributedDataParallel: one process per
GPU (or per CPU process), each on its share of every batch.

Network: four blocks of Conv2d(3x3) -> BatchNorm2d -> autocuda.nn.LIFNode (multi-step) -> 2x2 average pooling (the
last block without), then a linear classifier of the last spikes; the prediction is its output averaged over the
T steps. Each image (upsampled to 16x16) is the input at every step (direct coding); cross-entropy and SGD with
momentum and a cosine schedule.

    torchrun --standalone --nproc_per_node=2 examples/train_vgg_ddp.py              # two GPUs (NCCL)
    torchrun --standalone --nproc_per_node=2 examples/train_vgg_ddp.py --compile    # compiled, with CUDA graphs
    torchrun --standalone --nproc_per_node=2 examples/train_vgg_ddp.py --cpu        # two CPU processes (gloo)
    python examples/train_vgg_ddp.py --cpu --epochs 1 --quick                       # one process: a smoke test

What each process does (docs/distributed.md): it takes its GPU before anything else touches CUDA, builds the same
model (one seed everywhere), wraps it in DistributedDataParallel with `gradient_as_bucket_view=True` (the
gradients are views of the buckets DDP reduces: no copies), resets the neuron states before every batch, and
trains on its slice of each batch; DDP averages the gradients. On GPUs the model runs channels-last, and its
neurons keep no final states (`store_final_states=False`: each call starts from the reset states). `--compile`
compiles the DDP model with `mode="reduce-overhead"` on GPUs (CUDA graphs: the fastest of our DDP models,
docs/distributed.md "Which to pick"), as one graph rather than one per gradient bucket (a step this short is bound by
the host's work per graph, not by the gradients' reduction that the split would overlap).
Rank 0 evaluates and prints.
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch._dynamo
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autocuda.nn import LIFNode, Neuron


class SpikingVGG(nn.Module):
    """[T, B, 1, side, side] images -> [T, B, 10] scores. A model class of its own, not an nn.Sequential: under
    torch.compile its forward is one frame (Dynamo compiles DDP's inner module as a frame, and torch's own
    containers it would leave to their children, one small graph each)."""

    def __init__(self, channels: tuple[int, ...] = (32, 64, 128, 128), side: int = 16):
        super().__init__()
        self.convs, self.norms, self.neurons = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        before = 1
        for width in channels:
            self.convs.append(nn.Conv2d(before, width, 3, padding=1, bias=False))
            self.norms.append(nn.BatchNorm2d(width))
            neuron = LIFNode(tau=2.0, step_mode="m", detach_reset=True)
            neuron.store_final_states = False  # the states are reset before every batch: no call reads them after
            self.neurons.append(neuron)
            before = width
        self.classifier = nn.Linear(before * (side >> (len(channels) - 1)) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps, batch = x.shape[:2]
        for i, (conv, norm, neuron) in enumerate(zip(self.convs, self.norms, self.neurons)):
            y = norm(conv(x.flatten(0, 1)))  # T folded into the batch around the layers of single images
            x = neuron(y.unflatten(0, (steps, batch)))
            if i < len(self.convs) - 1:
                x = nn.functional.avg_pool2d(x.flatten(0, 1), 2).unflatten(0, (steps, batch))
        return self.classifier(x.flatten(2))


def load_data(quick: bool, side: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): images [B, 1, side, side] in [0, 1], labels [B]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    if quick:
        x_train, y_train, x_test, y_test = x_train[:128], y_train[:128], x_test[:64], y_test[:64]
    return x_train, y_train, x_test, y_test


def reset(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, Neuron):
            module.reset()


def scores(run: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, images: torch.Tensor, steps: int
           ) -> torch.Tensor:
    """The classifier's output averaged over `steps` steps of the images, by `run` (the model, or the DDP model
    around it, compiled or not), the states of `model`'s neurons reset first."""
    reset(model)
    return run(images.unsqueeze(0).expand(steps, *images.shape)).mean(0)


def start(cpu: bool) -> torch.device:
    """This process's device and its process group: torchrun's (RANK, WORLD_SIZE, ...), else a group of one."""
    if cpu or not torch.cuda.is_available():
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))), "nccl"
        torch.cuda.set_device(device)  # before anything else uses CUDA
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="samples per process and step")
    parser.add_argument("--steps", type=int, default=4, help="time steps T")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo, even where GPUs are")
    parser.add_argument("--compile", action="store_true", help="torch.compile the DDP model (CUDA graphs on GPUs)")
    parser.add_argument("--quick", action="store_true", help="a few batches: a smoke test")
    args = parser.parse_args()

    device = start(args.cpu)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(args.seed)  # the same initial weights in every process
        x_train, y_train, x_test, y_test = (t.to(device) for t in load_data(args.quick, 16, args.seed))
        model = SpikingVGG().to(device)
        if device.type == "cuda":  # cuDNN's convolutions run faster on channels-last activations, and so do ours
            model = model.to(memory_format=torch.channels_last)
            # but for the first convolution's weights: of one input channel, both layouts hold the same bytes, and
            # cuDNN gives their gradient the contiguous strides, which DDP wants to be the weights' own
            model.convs[0].to(memory_format=torch.contiguous_format)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      gradient_as_bucket_view=True)
        cuda_graphs = args.compile and device.type == "cuda"
        if args.compile:
            torch._dynamo.config.optimize_ddp = "no_optimization"  # one graph: the whole backward, then the reduction
        step_model = torch.compile(ddp, mode="reduce-overhead" if cuda_graphs else "default") if args.compile else ddp
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
        global_batch = args.batch * world
        for epoch in range(1, args.epochs + 1):
            model.train()
            started, total, count = time.perf_counter(), torch.zeros((), device=device), 0
            order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed + epoch))
            for first in range(0, len(order) - global_batch + 1, global_batch):  # whole global batches only
                mine = order[first + rank * args.batch:first + (rank + 1) * args.batch].to(device)
                if cuda_graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(scores(step_model, model, x_train[mine], args.steps), y_train[mine])
                loss.backward()  # DDP averages the gradients over the processes here
                opt.step()
                total, count = total + loss.detach(), count + 1  # summed on the device: no wait a step
            schedule.step()
            if rank == 0:
                model.eval()
                with torch.no_grad():
                    accuracy = float((scores(model, model, x_test, args.steps).argmax(1) == y_test).float().mean())
                print(f"epoch {epoch}: {world} process(es), train loss {float(total) / max(count, 1):.3f}, "
                      f"test accuracy {accuracy:.3f}, {time.perf_counter() - started:.1f} s")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
