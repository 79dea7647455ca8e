"""The package's version (read by `autocuda.__version__` and `autocuda --version`)."""
__version__ = "0.1.0"
