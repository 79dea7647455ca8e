"""Layer 0, the foundation: the error classes, lazy imports, the package's public module aliases, where the data
folders are, the optional progress bar. It imports nothing of the package's other layers."""
