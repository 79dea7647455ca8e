"""Host time of a LIFNode in step mode 's' on CUDA (T single steps per call, N neurons, float32), forward and training,
and of a multi-step call that goes on from tensor states; medians of rounds of many calls."""
import statistics
import sys
import time

import torch

import autocuda.nn as ann

T, N, CALLS, ROUNDS = 4, 4096, 500, 7
x = torch.rand(T, N, device="cuda")
xg = x.clone().requires_grad_()
single = ann.LIFNode(step_mode="s")
multi = ann.LIFNode(step_mode="m")


def steps():
    single.reset()
    for t in range(T):
        single(x[t])


def steps_train():
    single.reset()
    total = 0
    for t in range(T):
        total = total + single(xg[t]).sum()
    total.backward()


def going_on():  # a sequence call without a reset: from the last call's tensor states
    multi(x)


def timed(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


with torch.no_grad():
    fwd = timed(steps, CALLS) / T
    on = timed(going_on, CALLS)
train = timed(steps_train, CALLS // 2) / T
print(f"{sys.argv[1]}: single step forward {fwd:.1f} us/step, single step training {train:.1f} us/step, "
      f"sequence going on {on:.1f} us/call")
