"""Layer 5, the call: a neuron call on tensors. Custom ops and their autograd (`ops`), the native C++ operator
(`native/`), one program per layer configuration and input class (`program`), the functional API (`functional`),
dense memory layouts (`memory_order`) and the input encoders (`encoding`)."""
