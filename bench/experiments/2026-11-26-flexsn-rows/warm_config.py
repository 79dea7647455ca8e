"""Compile one of SpikingJelly FlexSN's autotuning configurations for one (model, dtype, shape) into Triton's disk
cache: its first call with the autotuner left only configuration INDEX (so it benchmarks nothing). Several such
processes, one per configuration, compile in parallel what one first call compiles in sequence; a later process's
autotuning then finds every configuration compiled.

    python warm_config.py INDEX --models alif --dtypes float32 --shapes 64x1M --out DIR
"""
import sys
from pathlib import Path

import triton.runtime.autotuner as autotuner

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import flexsn_peer  # noqa: E402

index = int(sys.argv[1])
original = autotuner.Autotuner.__init__


def one_config(self, *args, **kwargs):
    original(self, *args, **kwargs)
    self.configs = [self.configs[index]]


autotuner.Autotuner.__init__ = one_config
sys.exit(flexsn_peer.main(["--systems", "sj-flexsn", "--first-only", *sys.argv[2:]]))
