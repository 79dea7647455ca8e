#!/bin/bash
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
for r in 1 2; do for v in base notab r2 r2notab; do  # scratch/nv/<v>: f954661 autocuda and bench, README.md says what each changes
  (cd $HERE/scratch/nv/$v && AUTOCUDA_CACHE_DIR=/tmp/ac-$v PYTHONPATH=$HERE/scratch/nv/$v:/tmp/site timeout 200 python3 $HERE/bench/results/2026-11-30-h200-noise-floor/noise_floor.py $v-$r 2>&1 | grep -v Warn)
done; done | tee $OUT/nv.txt
