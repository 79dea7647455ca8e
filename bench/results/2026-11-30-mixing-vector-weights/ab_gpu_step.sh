#!/bin/bash
# On the device, from the repository root, carry [".whl", "scratch"]; scratch/old holds the tree before (see ab.sh).
# gpu_step.py with the tree before and after, alternating, three runs each.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
script=$PWD/bench/results/2026-11-30-mixing-vector-weights/gpu_step.py
for r in 1 2 3; do
  for t in old new; do
    if [ $t = old ]; then root=$PWD/scratch/old; else root=$PWD; fi
    (cd $root && AUTOCUDA_CACHE_DIR=/tmp/ac-$t PYTHONPATH=$root:/tmp/site python3 $script $t-$r 2>&1 | grep -v Warn)
  done
done | tee $OUT/gpu_step_ab.txt
