"""One record of a layer's configuration (`runtime.neuron_launch.NeuronConfig`), from which everything else derives:
the key finds the record again, the parameters' roles give the op's argument order, the kernel generated from the
record is the one its request names, the launch recipe binds the op's order, and a native plan's number slots read
the op's numbers by the kernel parameters' own names."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import ops
from autocuda.call.native import plan as native_plan
from autocuda.codegen.broadcast import PER_CHANNEL, PER_NEURON
from autocuda.codegen.kernels import neuron_kernel
from autocuda.runtime import configs
from autocuda.runtime.neuron_launch import NeuronConfig

# (spec, reset, detach_reset, constants, tensor signature: (name, broadcast, needs grad))
CASES = [
    ("lif", None, False, (), ()),
    ("lif", "soft", True, (), ()),
    ("alif", None, False, (), ()),
    ("izhikevich", None, False, (), ()),
    ("parametric_lif", None, False, (), (("w", PER_CHANNEL, True),)),
    ("lif", None, False, (), (("tau", PER_NEURON, True),)),
]


def config_of(case) -> NeuronConfig:
    name, reset, detach, constants, signature = case
    return configs.get_config(name, None, reset, detach, constants, signature, True)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{len(c[4])}" for c in CASES])
def test_the_record_round_trips(case, monkeypatch):
    config = config_of(case)
    # the key finds the very record, and the same configuration gives the same key
    assert configs.config(config.key) is config and ops.entry(config.key) is config
    assert config_of(case).key == config.key
    # the one parameter list: every parameter of the spec has one role; the op's order follows from the roles
    roles = dict(config.parameters)
    assert tuple(roles) == tuple(p.name for p in config.spec.params)
    assert config.scalars == tuple(n for n, role in config.parameters if role == "scalar")
    assert config.tensor_names == tuple(n for n, role in config.parameters if role == "tensor")
    assert all(roles[n] == "constant" for n, _ in config.constants)
    assert configs.config_info(config.key) == (config.state_names, config.tensors, config.scalars, config.reset)
    order = config.op_inputs
    assert order == (*config.input_keys, *(f"{s}_init" for s in config.state_names), *config.tensor_names,
                     *config.op_scalars)
    form = ops.forward_form(config.key, False, False, False, False, True)  # multi-step inference, numbers
    assert form.kernel.names == order
    # the kernel request: the record's kernel is the one `neuron_kernel` makes of the record's fields
    kernel = config.kernel("fptt", torch.float64, given_inits=False)
    want = neuron_kernel(config.spec, "fptt", "float64", reset=config.reset, detach_reset=config.detach_reset,
                         constants=dict(config.constants), surrogate=config.surrogate,
                         tensors=list(config.tensor_names),
                         per_neuron=[n for n, kind in config.tensors if kind == PER_NEURON],
                         per_channel=[n for n, kind in config.tensors if kind == PER_CHANNEL], given_inits=False)
    assert kernel.full_codes == want.full_codes
    # the kernel takes by value exactly the op's numbers (initial states given as numbers, scalars, channel sizes)
    by_value = {n for n, p in kernel.cparams.items() if not p.pointer and n not in ("N", "T")}
    assert by_value == {*(f"{s}_init" for s in config.state_names), *config.op_scalars}
    if config.tensors:
        return  # a native plan takes no tensor parameters
    # a native plan's number slots: each reads, among the call's numbers (initial states, then the op's scalars),
    # the value the kernel parameter of that slot names
    monkeypatch.setattr(native_plan, "_kernel_function", lambda bound: (native_plan.RUNNERS["host"], 1, 0))
    x = torch.rand(3, 8, dtype=torch.float64)
    numbers = [(f"{s}_init", 0.0) for s in config.state_names] + [(n, 1.0) for n in config.op_scalars]
    bound = form.kernel.bind((x, *(v for _, v in numbers)), x, 8, 3, "host")  # the recipe bound to the op's order
    words = native_plan.plan_words(x, [], len(numbers), bound, form, None, None, ()).words
    slots = words[len(words) - 3 * len(bound.binding.order):]
    names = [name for _, name, _ in bound.recipe.sources]
    read = {names[i]: numbers[slots[3 * i + 1]][0] for i in range(len(names)) if slots[3 * i] == native_plan.NUMBER}
    assert read == {name: name for name, _ in numbers}
