#!/bin/bash
# On the device, from the repository root, carry [".whl", "scratch"]; before it, here:
#   rm -rf scratch/old && mkdir -p scratch/old && git archive a12c46d autocuda bench ':!bench/results' | tar -x -C scratch/old
# The GPU tests of the parallel spiking neurons; then gpu_step.py and the classes' training steps against
# SpikingJelly's, the tree before (one neuron a thread) and after, alternating, each tree with a cache of its own.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
AUTOCUDA_CACHE_DIR=/tmp/ac-new PYTHONPATH=$PWD:/tmp/site python3 -m pytest -q -p no:cacheprovider -n 8 \
  tests/gpu/test_psn_gpu.py 2>&1 | tail -3 | tee $OUT/psn_gpu_tests.txt
script=$PWD/bench/results/2026-11-30-mixing-two-lanes/gpu_step.py
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then root=$PWD/scratch/old; else root=$PWD; fi
    (cd $root && AUTOCUDA_CACHE_DIR=/tmp/ac-$t PYTHONPATH=$root:/tmp/site python3 $script $t-$r 2>&1 | grep "gpu step" \
       | cut -c1-90)
    (cd $root && AUTOCUDA_CACHE_DIR=/tmp/ac-$t PYTHONPATH=$root:/tmp/site python3 -m bench.sj_classes \
       --classes PSN,MaskedPSN,SlidingPSN 2>&1 | grep -i "psn" | sed "s/^/$t-$r /")
  done
done | tee $OUT/ab.txt
