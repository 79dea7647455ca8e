#!/usr/bin/env python
"""Run autocuda's benchmark suite and save the results under bench/results/<date>-<gpu>/.

Same options as `autocuda bench` (bench/README.md, or --help). This checkout's package is used, installed or not.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: its autocuda and its bench

from bench.suite import main  # noqa: E402 - after the checkout is on the path

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
