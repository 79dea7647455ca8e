#!/usr/bin/env python
"""Train a network of SpikingJelly's model zoo on scikit-learn's 8x8 digits (no download), once with
SpikingJelly's neurons and once with autocuda's (the same initial weights), and report each one's test
accuracy and time per epoch.

The model is SpikingJelly's own (`spikingjelly.activation_based.model`); only `spiking_neuron` differs:
`spikingjelly...neuron.LIFNode` or `autocuda.nn.LIFNode`. Each image (grey, repeated over 3 channels) is the
input at each of T steps (direct coding); the prediction is the mean output over time, trained with
cross-entropy and Adam, `functional.reset_net` after every batch.

- `--model sew_resnet18` (the default) runs at the digits' own 8x8 (its stem brings them to 2x2, then 1x1);
  with 2 CPU cores, seconds to a minute per epoch (shared machines vary).
- `--model spiking_resnet18` runs at 8x8 too; it learned more slowly here (46% test accuracy after 6
  epochs with SpikingJelly's neurons, seed 0).
- `--model spiking_vgg11_bn`, the zoo's VGG, needs 32x32 inputs (five 2x2 poolings: the digits are upsampled)
  and carries a classifier of 120M weights: minutes per epoch on a CPU, so it is meant for a GPU.

    python examples/train_sj_vgg_digits.py                          # sew_resnet18, CPU or GPU
    python examples/train_sj_vgg_digits.py --model spiking_vgg11_bn --device cuda
    python examples/train_sj_vgg_digits.py --epochs 1 --quick       # a smoke test (seconds)
"""
from __future__ import annotations

import argparse
import sys
import time
import types

import torch
from torch import nn

import autocuda.nn

MODELS = {"spiking_resnet18": ("spiking_resnet", 8, {}), "sew_resnet18": ("sew_resnet", 8, {"cnf": "ADD"}),
          "spiking_vgg11_bn": ("spiking_vgg", 32, {})}


def import_zoo(module: str):
    """SpikingJelly's zoo module; its import of torchvision serves a download helper only, which this script
    never calls, so a stand-in is put in place where torchvision is not installed."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        stub = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.models", "torchvision.models.utils")}
        stub["torchvision.models.utils"].load_state_dict_from_url = None  # type: ignore[attr-defined]
        sys.modules.update(stub)
    import importlib

    return importlib.import_module(f"spikingjelly.activation_based.model.{module}")


def load_data(quick: bool, side: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): images [B, 3, side, side] in [0, 1], labels [B]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if side != 8:
        x = nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
    x = x.expand(-1, 3, -1, -1).contiguous()
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    if quick:
        x_train, y_train, x_test, y_test = x_train[:128], y_train[:128], x_test[:64], y_test[:64]
    return x_train, y_train, x_test, y_test


def build(model: str, neuron: type, steps: int) -> nn.Module:
    module, _, extra = MODELS[model]
    from spikingjelly.activation_based import functional, surrogate

    net = getattr(import_zoo(module), model)(spiking_neuron=neuron, surrogate_function=surrogate.ATan(),
                                              detach_reset=True, num_classes=10, **extra)
    functional.set_step_mode(net, "m")
    return net


def run_epoch(net: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, batch: int,
              optimizer: torch.optim.Optimizer | None, device: torch.device, seed: int) -> float:
    """One pass over (x, y), training when an optimizer is given; the accuracy."""
    from spikingjelly.activation_based import functional

    net.train(optimizer is not None)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)) if optimizer else None
    correct = 0
    with torch.set_grad_enabled(optimizer is not None):
        for start in range(0, len(x), batch):
            index = order[start:start + batch] if order is not None else slice(start, start + batch)
            xb, yb = x[index].to(device), y[index].to(device)
            out = net(xb.unsqueeze(0).expand(steps, *xb.shape)).mean(0)  # [T, B, ...] in, [B, 10] out
            if optimizer is not None:
                optimizer.zero_grad()
                nn.functional.cross_entropy(out, yb).backward()
                optimizer.step()
            functional.reset_net(net)
            correct += int((out.argmax(1) == yb).sum())
    return correct / len(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="sew_resnet18")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="time steps T")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a small subset, for a smoke test")
    args = parser.parse_args()
    from spikingjelly.activation_based import neuron as sj_neuron

    device = torch.device(args.device)
    x_train, y_train, x_test, y_test = load_data(args.quick, MODELS[args.model][1], args.seed)
    torch.manual_seed(args.seed)
    theirs = build(args.model, sj_neuron.LIFNode, args.steps)
    ours = build(args.model, autocuda.nn.LIFNode, args.steps)
    ours.load_state_dict(theirs.state_dict())  # the same start
    print(f"{args.model} on digits ({len(x_train)} train, {len(x_test)} test), T = {args.steps}, {device}")
    for name, net in (("SpikingJelly LIFNode", theirs), ("autocuda LIFNode", ours)):
        net.to(device)
        optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
        for epoch in range(args.epochs):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            train_accuracy = run_epoch(net, x_train, y_train, args.steps, args.batch, optimizer, device,
                                       args.seed + epoch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            test_accuracy = run_epoch(net, x_test, y_test, args.steps, 256, None, device, 0)
            print(f"{name}: epoch {epoch + 1}: {seconds:.1f} s, train accuracy {train_accuracy:.3f}, "
                  f"test accuracy {test_accuracy:.3f}")


if __name__ == "__main__":
    main()
