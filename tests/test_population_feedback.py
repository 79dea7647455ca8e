"""The inter-layer connection nodes' feedback (`nn.spikingjelly_ilc.population_feedback`): one batched matrix
product per action, equal to `conn`'s grouped convolution (values and the gradients of the spikes, the weight and the
bias); a `conn` that is not the per-action map runs as it is."""
from __future__ import annotations

import torch
from torch import nn

from autocuda.nn.spikingjelly_ilc import population_connection, population_feedback

F64 = torch.float64


def test_the_product_equals_the_grouped_convolution():
    torch.manual_seed(0)
    conn = population_connection(3, 4).to(F64)
    spike = (torch.rand(5, 2, 12, dtype=F64) > 0.5).to(F64).requires_grad_()
    got = population_feedback(conn, spike, 3, 4)
    want = conn(spike.reshape(-1, 3, 4)).reshape(spike.shape)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    weights = torch.randn(got.shape, dtype=F64)
    for g, w in zip(torch.autograd.grad((got * weights).sum(), (spike, conn.weight, conn.bias)),
                    torch.autograd.grad((want * weights).sum(), (spike, conn.weight, conn.bias))):
        torch.testing.assert_close(g, w, rtol=1e-13, atol=1e-13)


def test_a_changed_conn_runs_as_it_is():
    calls = []

    class Doubling(nn.Conv1d):
        def forward(self, x):
            calls.append(x.shape)
            return 2 * super().forward(x)

    conn = Doubling(3, 12, 4, groups=3).double()
    spike = torch.ones(2, 12, dtype=F64)
    got = population_feedback(conn, spike, 3, 4)
    assert calls == [(2, 3, 4)]
    torch.testing.assert_close(got, 2 * nn.Conv1d.forward(conn, spike.reshape(-1, 3, 4)).reshape(spike.shape))
