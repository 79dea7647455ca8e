#!/bin/bash
# GPU suite on the new tree, then old (scratch/old: HEAD) and new tree's benchmark rows for ALIF and LIF training.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
PYTHONPATH=$PWD timeout 330 python3 -m pytest -m gpu -q -x -p no:cacheprovider 2>&1 | tail -25 > $OUT/gpu_suite.txt
tail -5 $OUT/gpu_suite.txt
ARGS="--workloads lif,alif --dtypes float32,bfloat16 --shapes 1024x16K,256x64K,64x1M,8x8M --parts speed,memory --modes training --no-peers"
(cd scratch/old && AUTOCUDA_CACHE_DIR=/tmp/c_old PYTHONPATH=$PWD python3 bench/run.py $ARGS --out /tmp/old > /tmp/old.log 2>&1) || tail -20 /tmp/old.log
AUTOCUDA_CACHE_DIR=/tmp/c_new PYTHONPATH=$PWD python3 bench/run.py $ARGS --out /tmp/new > /tmp/new.log 2>&1 || tail -20 /tmp/new.log
cp /tmp/old/results.json $OUT/results_old.json; cp /tmp/new/results.json $OUT/results_new.json; cp /tmp/new/table.txt $OUT/table_new.txt
python3 bench/experiments/2026-11-24-h100-replay/ab.py /tmp/old/results.json /tmp/new/results.json | tee $OUT/ab.txt
