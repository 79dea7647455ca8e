"""Layer 4, the neuron runtime: generated kernels kept on disk (`records`), launch layouts and tuning (`tuning`), a
layer configuration's kernels bound to a call (`configs`, `neuron_launch`), and the torch reference of a step
(`reference`)."""
