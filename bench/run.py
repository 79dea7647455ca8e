#!/usr/bin/env python
"""Run autocuda's benchmark suite (issue 6) and save the results under bench/results/<date>-<gpu>/.

Same options as `autocuda bench` (see bench/README.md or --help). This checkout's package is used, installed or not.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autocuda.benchmark import main  # noqa: E402 - after the checkout is on the path

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], results_root=HERE / "results"))
