"""SpikingJelly 2.0's noisy neurons (neuron/noisy.py; the noisy spiking actor networks of NoisySAN): in training,
each step adds `sigma * noise` to the input and (spiking nodes) to the output spike, where the noise is a
pre-generated episode of Gaussian noise with a 1/f^beta spectrum over time (`reset_noise`), one value per neuron
and step shared by the batch, or a per-sample episode loaded with `load_colored_noise`.

The noise enters as SpikingJelly's does, with torch around a shipped spec's kernels, so that under the same noise
the outputs, states and gradients are SpikingJelly's:

| class                    | spec                 | noise                                                         |
|--------------------------|----------------------|---------------------------------------------------------------|
| `NoisyCUBALIFNode`       | `cuba_lif_discrete`  | x + sigma_v·ε_v before the kernels, s + sigma_s·ε_s after     |
| `NoisyILCCUBALIFNode`    | `cuba_lif_discrete`  | as above, step by step, with the ILC feedback between steps   |
| `NoisyNonSpikingIFNode`  | `nonspiking_if`      | x + sigma·ε_v; `sigma` an `nn.Parameter` [num_node] (learned)  |

`powerlaw_psd_gaussian` makes the episodes (Timmer and König's method), equal to SpikingJelly's for one
`random_state`; `reset_noise` seeds it from torch's generator, so `torch.manual_seed` makes episodes repeatable
(SpikingJelly's draw from fresh entropy). White noise drawn inside the kernels instead (a counter-based draw per
neuron, sample and step, seeded by torch) is the shipped spec `noisy_cuba_lif` (`Neuron("noisy_cuba_lif")`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from .arguments import checked_attribute, fixed_at_construction, require_number
from .memory import MultiStepOnly
from .neuron import Neuron
from .spikingjelly_ilc import (
    POPULATION_FOLLOWS,
    check_float,
    check_population_input,
    check_size,
    population_connection,
    population_feedback,
)
from .spikingjelly_more import RECT
from .spikingjelly_variants import DECODES

__all__ = ["powerlaw_psd_gaussian", "NoisyBaseNode", "NoisyCUBALIFNode", "NoisyILCBaseNode", "NoisyILCCUBALIFNode",
           "NoisyNonSpikingBaseNode", "NoisyNonSpikingIFNode"]


def powerlaw_psd_gaussian(exponent: float, size: int | Iterable[int], fmin: float = 0.0,
                          random_state: Any = None) -> np.ndarray:
    """Gaussian noise of unit variance whose power spectrum falls as (1/f)^exponent along the last axis of `size`
    (the other axes independent): 0 white, 1 pink, 2 brown. Below `fmin` (a fraction of the sampling rate, in
    [0, 0.5], at least 1/samples) the spectrum is flat. `random_state`: an int, None, or a numpy Generator or
    RandomState. Random amplitudes and phases per frequency, then an inverse real FFT (Timmer and König, A&A 300,
    707, 1995)."""
    shape = [size] if isinstance(size, (int, np.integer)) else list(size)
    if not shape or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in shape):
        raise ValueError(f"size: expected a whole number or a sequence of them, each >= 1, got {size!r}")
    samples = int(shape[-1])
    if samples < 2:
        raise ValueError(f"size: the last axis (time) needs at least 2 samples for a spectrum, got {samples}")
    if not 0 <= fmin <= 0.5:
        raise ValueError(f"fmin: must be in [0, 0.5] (a fraction of the sampling rate), got {fmin!r}")
    frequencies = np.fft.rfftfreq(samples)
    # frequencies below the cutoff take the cutoff's amplitude (0 Hz included: its power is finite)
    below = int(np.sum(frequencies < max(fmin, 1.0 / samples)))
    if below < len(frequencies):
        frequencies[:below] = frequencies[below]
    amplitude = frequencies ** (-exponent / 2.0)
    # the standard deviation of the series the amplitudes give (the Nyquist term of an even length counted once)
    weights = amplitude[1:].copy()
    weights[-1] *= (1 + samples % 2) / 2.0
    deviation = 2 * np.sqrt(np.sum(weights ** 2)) / samples
    normal = _normal(random_state)
    spectrum_shape = [*shape[:-1], len(frequencies)]
    real = normal(scale=amplitude, size=spectrum_shape)
    imaginary = normal(scale=amplitude, size=spectrum_shape)
    # the components at 0 and (for an even length) at the Nyquist frequency are real: their power all in `real`
    if samples % 2 == 0:
        imaginary[..., -1] = 0
        real[..., -1] *= np.sqrt(2)
    imaginary[..., 0] = 0
    real[..., 0] *= np.sqrt(2)
    return np.fft.irfft(real + 1j * imaginary, n=samples, axis=-1) / deviation


def _normal(random_state: Any) -> Any:
    if random_state is None or (isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool)):
        return np.random.default_rng(random_state).normal
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)):
        return random_state.normal
    raise ValueError("random_state: expected an int, None, a numpy.random.Generator or a numpy.random.RandomState, "
                     f"got {type(random_state).__name__}")


def episodes(beta: float, num_node: int, num_rl_step: int, steps: int, random_state: Any) -> torch.Tensor:
    """SpikingJelly's noise episodes: [num_rl_step, T, num_node] float32, each neuron's series 1/f^beta over all
    episodes' steps together (num_rl_step * T samples)."""
    series = powerlaw_psd_gaussian(beta, [num_node, num_rl_step * steps], random_state=random_state)
    return torch.tensor(series.reshape(num_node, num_rl_step, steps), dtype=torch.float32).permute(1, 2, 0)


def numpy_generator(random_state: Any) -> np.random.Generator | np.random.RandomState:
    """The numpy generator of `random_state` (a generator, or a seed); None seeds one from torch's default
    generator, so that `torch.manual_seed` repeats the episodes."""
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)):
        return random_state
    if random_state is None:
        random_state = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)):
        raise ValueError("random_state: expected an int, None, a numpy.random.Generator or a "
                         f"numpy.random.RandomState, got {type(random_state).__name__}")
    return np.random.default_rng(random_state)


def add_per_step(x_seq: torch.Tensor, scale: Any, noise_seq: torch.Tensor) -> torch.Tensor:
    """x_seq[t] + scale * noise_seq[t] for each t, each step's shapes broadcast against each other (SpikingJelly
    adds per step); the product is taken in the noise's dtype, as SpikingJelly's."""
    noise = scale * noise_seq
    extra = x_seq.dim() - noise.dim()
    if extra > 0:
        noise = noise.reshape(noise.shape[0], *[1] * extra, *noise.shape[1:])
    elif extra < 0:
        x_seq = x_seq.reshape(x_seq.shape[0], *[1] * -extra, *x_seq.shape[1:])
    return x_seq + noise


def check_sequence(layer: nn.Module, x_seq: Any) -> None:
    name = type(layer).__name__
    if not isinstance(x_seq, torch.Tensor):
        raise TypeError(f"{name}: x_seq: expected a tensor [T, *], got {type(x_seq).__name__}")
    if x_seq.dim() < 1 or x_seq.shape[0] != layer.T:
        raise ValueError(f"{name}: x_seq: expected shape [T = {layer.T}, *] (the layer's T), got "
                         f"{tuple(x_seq.shape)}")


class _Episodes:
    """The noise bookkeeping SpikingJelly's noisy nodes share: `reset_noise` makes episodes, each training call
    without loaded noise takes the next (`noise_step`), `load_colored_noise` / `cancel_load` replace them."""

    num_node: int
    beta: float
    noise_step: int

    def _episode(self, name: str, loaded: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """One noise's [T, ...] sequence of this call: the loaded noise (batch, T, num_node) by step, or the
        current episode of `name` (moved to `device`)."""
        if loaded is not None:
            if loaded.dim() < 2 or loaded.shape[1] < self.T:
                raise ValueError(f"{type(self).__name__}: the loaded noise must be [batch, T >= {self.T}, ...], got "
                                 f"{tuple(loaded.shape)}")
            return loaded[:, :self.T].movedim(1, 0).to(device)
        table = self.__dict__.get(name)
        if table is None:
            raise RuntimeError(f"{type(self).__name__}: a training call (is_training=True) needs noise: call "
                               "reset_noise(num_rl_step) first, or load_colored_noise(cn)")
        if self.noise_step >= table.shape[0]:
            raise RuntimeError(f"{type(self).__name__}: the {table.shape[0]} noise episode(s) of reset_noise are "
                               "used up: call reset_noise again")
        # the first T steps of the episode (as SpikingJelly's calls index them), where T was changed since
        if table.shape[1] < self.T:
            raise RuntimeError(f"{type(self).__name__}: the noise episodes of reset_noise hold {table.shape[1]} "
                               f"steps, fewer than T = {self.T}: call reset_noise again after changing T")
        return table[self.noise_step, :self.T].to(device)

    T = checked_attribute("T", functools.partial(check_size, "T"), "The steps of a call")

    def _new_episodes(self, num_rl_step: int, generator: np.random.Generator | np.random.RandomState
                      ) -> torch.Tensor:
        check_size("num_rl_step", num_rl_step)
        return episodes(self.beta, self.num_node, num_rl_step, self.T, generator)


class NoisyBaseNode(_Episodes, MultiStepOnly, Neuron):
    """`NoisyBaseNode(num_node, is_training=True, T=5, sigma_init=0.5, beta=0., v_threshold=0.5, v_reset=0.,
    surrogate_function=Rect())`: the base of the noisy spiking nodes (SpikingJelly's leaves the charge abstract);
    a subclass names its spec in `SPEC` and passes its parameters as keywords. The noise scales `sigma_v` and
    `sigma_s` are sigma_init / sqrt(num_node), numbers (not learned), as SpikingJelly's."""

    SPEC: str | None = None
    num_node = fixed_at_construction("num_node", "the noise's and the noise scales' shapes follow it")

    def __init__(self, num_node: int, is_training: bool = True, T: int = 5, sigma_init: float = 0.5,
                 beta: float = 0.0, v_threshold: float = 0.5, v_reset: float | None = 0.0,
                 surrogate_function: Any = RECT, backend: str | None = None, **spec_params: Any):
        if self.SPEC is None:
            raise TypeError(f"{type(self).__name__} is a base class (its charge is abstract): use "
                            "NoisyCUBALIFNode or NoisyILCCUBALIFNode")
        check_float("v_reset", v_reset, none=True)
        check_float("v_threshold", v_threshold)
        check_size("num_node", num_node)
        check_size("T", T)
        require_number("sigma_init", sigma_init, finite=True)  # it scales every draw: NaN outputs
        require_number("beta", beta, finite=True)
        super().__init__(self.SPEC, surrogate_function=surrogate_function, step_mode="m", backend=backend,
                         v_threshold=v_threshold, v_reset=v_reset, **spec_params)
        self.__dict__["_num_node"] = num_node
        self.is_training, self.T, self.beta = is_training, T, beta
        self.sigma_v = self.sigma_s = sigma_init / math.sqrt(num_node)
        self.cn_v: torch.Tensor | None = None
        self.cn_s: torch.Tensor | None = None
        self.noise_step = -1  # the episode of the last training call; reset_noise makes the episodes

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """x_seq [T, *] -> the (noisy, in training) spikes; every call starts from the initial states."""
        check_sequence(self, x_seq)
        self.reset()  # SpikingJelly's init_tensor
        noise_v = noise_s = None
        if self.is_training:
            if self.cn_v is None or self.cn_s is None:
                self.noise_step += 1
            noise_v = self._episode("eps_v_seq", self.cn_v, x_seq.device)
            noise_s = self._episode("eps_s_seq", self.cn_s, x_seq.device)
        return self._noisy_sequence(x_seq, noise_v, noise_s)

    def _noisy_sequence(self, x_seq: torch.Tensor, noise_v: torch.Tensor | None,
                        noise_s: torch.Tensor | None) -> torch.Tensor:
        """The whole sequence in one multi-step call of the spec, the noise added around it."""
        if noise_v is not None:
            x_seq = add_per_step(x_seq, self.sigma_v, noise_v)
        spikes = Neuron.multi_step_forward(self, x_seq)
        return spikes if noise_s is None else add_per_step(spikes, self.sigma_s, noise_s)

    def reset_noise(self, num_rl_step: int, random_state: Any = None) -> None:
        """New episodes for `num_rl_step` training calls (`eps_v_seq`, `eps_s_seq`: [num_rl_step, T, num_node]);
        `random_state` (ours) seeds them, else a seed from torch's generator."""
        generator = numpy_generator(random_state)
        self.eps_v_seq = self._new_episodes(num_rl_step, generator)
        self.eps_s_seq = self._new_episodes(num_rl_step, generator)
        self.noise_step = -1

    def get_colored_noise(self) -> torch.Tensor:
        """The current episode's noise, [T, 2 * num_node] (ε_v then ε_s), for `load_colored_noise` later."""
        return torch.cat([self.eps_v_seq[self.noise_step], self.eps_s_seq[self.noise_step]], dim=1)

    def load_colored_noise(self, cn: torch.Tensor) -> None:
        """Use `cn` [batch, T, 2 * num_node] (stacked `get_colored_noise()`s) until `cancel_load()`."""
        self.cn_v = cn[:, :, :self.num_node]
        self.cn_s = cn[:, :, self.num_node:]

    def cancel_load(self) -> None:
        self.cn_v = self.cn_s = None


class NoisyCUBALIFNode(NoisyBaseNode):
    SPEC = "cuba_lif_discrete"

    def __init__(self, num_node: int, c_decay: float = 0.5, v_decay: float = 0.75, is_training: bool = True,
                 T: int = 5, sigma_init: float = 0.5, beta: float = 0.0, v_threshold: float = 0.5,
                 v_reset: float | None = 0.0, surrogate_function: Any = RECT, backend: str | None = None):
        super().__init__(num_node, is_training, T, sigma_init, beta, v_threshold, v_reset, surrogate_function,
                         backend, c_decay=c_decay, v_decay=v_decay)


class NoisyILCBaseNode(NoisyBaseNode):
    """The noisy nodes with SpikingJelly's inter-layer connection (`conn`, see spikingjelly_ilc): each step's noisy
    spikes feed the next step's input; run step by step."""

    act_dim = fixed_at_construction("act_dim", POPULATION_FOLLOWS)
    dec_pop_dim = fixed_at_construction("dec_pop_dim", POPULATION_FOLLOWS)

    def __init__(self, act_dim: int, dec_pop_dim: int, is_training: bool = True, T: int = 5,
                 sigma_init: float = 0.5, beta: float = 0.0, v_threshold: float = 1.0,
                 v_reset: float | None = 0.0, surrogate_function: Any = RECT, backend: str | None = None,
                 **spec_params: Any):
        check_size("act_dim", act_dim)
        check_size("dec_pop_dim", dec_pop_dim)
        super().__init__(act_dim * dec_pop_dim, is_training, T, sigma_init, beta, v_threshold, v_reset,
                         surrogate_function, backend, **spec_params)
        self.__dict__["_act_dim"], self.__dict__["_dec_pop_dim"] = act_dim, dec_pop_dim
        self.conn = population_connection(act_dim, dec_pop_dim)

    def _noisy_sequence(self, x_seq: torch.Tensor, noise_v: torch.Tensor | None,
                        noise_s: torch.Tensor | None) -> torch.Tensor:
        check_population_input(self, x_seq, self.T)
        spikes: list[torch.Tensor] = []
        for t, x in enumerate(x_seq.unbind(0)):
            if t:
                x = x + population_feedback(self.conn, spikes[-1], self.act_dim, self.dec_pop_dim)
            if noise_v is not None:
                x = x + self.sigma_v * noise_v[t]
            spike = self.single_step_forward(x)
            spikes.append(spike if noise_s is None else spike + self.sigma_s * noise_s[t])
        return torch.stack(spikes)


class NoisyILCCUBALIFNode(NoisyILCBaseNode):
    SPEC = "cuba_lif_discrete"

    def __init__(self, act_dim: int, dec_pop_dim: int, c_decay: float = 0.5, v_decay: float = 0.75,
                 is_training: bool = True, T: int = 5, sigma_init: float = 0.5, beta: float = 0.0,
                 v_threshold: float = 1.0, v_reset: float | None = 0.0, surrogate_function: Any = RECT,
                 backend: str | None = None):
        super().__init__(act_dim, dec_pop_dim, is_training, T, sigma_init, beta, v_threshold, v_reset,
                         surrogate_function, backend, c_decay=c_decay, v_decay=v_decay)


# SpikingJelly's decodes of the non-spiking noisy nodes: the others' (`DECODES`), the last membrane spelled 'last-me'
NOISY_DECODES = {**{name: decode for name, decode in DECODES.items() if name != "last_mem"},
                 "last-me": DECODES["last_mem"]}


def _checked_decode(decode: Any) -> str | None:
    if not isinstance(decode, (str, type(None))) or decode not in NOISY_DECODES:
        raise ValueError(f"decode: expected one of {list(NOISY_DECODES)} (SpikingJelly's noisy nodes spell the "
                         f"last membrane 'last-me'), got {decode!r}")
    return decode


class NoisyNonSpikingBaseNode(_Episodes, MultiStepOnly, Neuron):
    """`NoisyNonSpikingBaseNode(num_node, is_training=True, T=5, sigma_init=0.5, beta=0., decode=None)`: the base
    of the noisy non-spiking nodes; `sigma` is a learned `nn.Parameter` [num_node] (float32, sigma_init /
    sqrt(num_node)), as SpikingJelly's."""

    SPEC: str | None = None
    num_node = fixed_at_construction("num_node", "sigma's shape follows it")

    def __init__(self, num_node: int, is_training: bool = True, T: int = 5, sigma_init: float = 0.5,
                 beta: float = 0.0, decode: str | None = None, backend: str | None = None):
        if self.SPEC is None:
            raise TypeError(f"{type(self).__name__} is a base class (its charge is abstract): use "
                            "NoisyNonSpikingIFNode")
        _checked_decode(decode)
        check_size("num_node", num_node)
        check_size("T", T)
        require_number("sigma_init", sigma_init, finite=True)  # it scales every draw: NaN outputs
        require_number("beta", beta, finite=True)
        super().__init__(self.SPEC, step_mode="m", backend=backend)
        self.__dict__["_num_node"] = num_node
        self.is_training, self.T, self.beta, self.decode = is_training, T, beta, decode
        self.sigma = nn.Parameter(torch.full((num_node,), sigma_init / math.sqrt(num_node), dtype=torch.float))
        self.cn: torch.Tensor | None = None
        self.noise_step = -1

    decode = checked_attribute("decode", _checked_decode, "How the membranes are decoded (`NOISY_DECODES`)")

    def forward(self, x_seq: torch.Tensor) -> Any:  # type: ignore[override]
        """x_seq [T, *] -> the membranes, decoded; every call starts from v = 0."""
        check_sequence(self, x_seq)
        self.reset()
        if self.is_training:
            if self.cn is None:
                self.noise_step += 1
            x_seq = add_per_step(x_seq, self.sigma, self._episode("eps_seq", self.cn, x_seq.device))
        return NOISY_DECODES[self.decode](Neuron.multi_step_forward(self, x_seq))

    def reset_noise(self, num_rl_step: int, random_state: Any = None) -> None:
        """New episodes for `num_rl_step` training calls (`eps_seq`: [num_rl_step, T, num_node])."""
        self.eps_seq = self._new_episodes(num_rl_step, numpy_generator(random_state))
        self.noise_step = -1

    def get_colored_noise(self) -> torch.Tensor:
        return self.eps_seq[self.noise_step]

    def load_colored_noise(self, cn: torch.Tensor) -> None:
        """Use `cn` [batch, T, num_node] until `cancel_load()`."""
        self.cn = cn

    def cancel_load(self) -> None:
        self.cn = None


class NoisyNonSpikingIFNode(NoisyNonSpikingBaseNode):
    SPEC = "nonspiking_if"
