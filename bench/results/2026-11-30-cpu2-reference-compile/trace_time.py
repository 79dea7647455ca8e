"""Seconds torch.compile takes on a reference-backend LIFNode's first training call (Linear + LIFNode, T steps,
fullgraph), in a fresh process after one warm-up compile of another layer (Dynamo's and AOTAutograd's one-time
set-up out of the figure). Prints one JSON line: backend, T, seconds."""
import json
import sys
import time

import torch

from autocuda.nn import LIFNode

backend, steps = sys.argv[1], int(sys.argv[2])
warm = torch.nn.Sequential(torch.nn.Linear(4, 4), LIFNode(step_mode="m", backend="reference", tau=3.0))
torch.compile(warm, fullgraph=True, backend=backend)(torch.randn(2, 1, 4)).sum().backward()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), LIFNode(step_mode="m", backend="reference"))
x = torch.randn(steps, 4, 8) * 3
net(x)  # the layer's eager call first: its step is derived and prepared outside the timed trace
net[1].reset()
compiled = torch.compile(net, fullgraph=True, backend=backend)
start = time.perf_counter()
compiled(x).sum().backward()
print(json.dumps({"backend": backend, "steps": steps, "seconds": round(time.perf_counter() - start, 3)}))
