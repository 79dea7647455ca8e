"""`python -m bench` from the repository's root: run the benchmark suite (`bench/suite.py`; --help lists its
options). Results go to bench/results/<date>-<gpu>/ unless --out names a folder."""
from __future__ import annotations

import sys

from .suite import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
