"""Layer 2, the toolchain: CUDA text compiled and launched, knowing no neuron. NVRTC and the CUDA driver (`nvrtc`,
`driver`, `compile`, `launch`, `arrays`), the host runner that runs the same CUDA on the CPU (`host/`), the disk
cache (`store`, `parse_marks`), C naming facts (`cnames`) and the C text builder (`code`)."""
