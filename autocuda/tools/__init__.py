"""Layer 7, the tools: the `autocuda` command (`cli`), NIR import and export (`nir/`), kernel checks against the
reference (`testing/`), monitors (`monitor`) and plots (`plot`)."""
