#!/bin/bash
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
for r in 1 2; do for tree in old new new7; do
  path=$HERE; [ $tree = old ] && path=$HERE/scratch/oldnoise; [ $tree = new7 ] && path=$HERE/scratch/new7
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 200 python3 $HERE/bench/results/2026-11-30-h200-noise-segments/noise_ab.py $tree-$r 2>&1)
done; done | tee $OUT/noise_ab.txt
PYTHONPATH=$HERE:/tmp/site timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "noise or noisy or Noisy" -n 8 2>&1 | tail -5 | tee $OUT/gpu-tests.txt
