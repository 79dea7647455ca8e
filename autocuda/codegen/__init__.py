"""Layer 3, code generation: the dtype table (`dtypes`), the builder DSL (`ckernel`, `cfunction`), the sympy-to-C
printer, kernel options, plans and loop schedules, the Jinja skeletons (`templates/`), and `kernels`: a spec's
derivation to kernel source."""
