#!/bin/bash
# Old tree (scratch/old: HEAD) then new tree: long shapes, the core six, float32/bfloat16, both modes, ours only.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
ARGS="--workloads core --dtypes float32,bfloat16 --shapes 1024x16K,256x64K --parts speed --no-peers"
(cd scratch/old && AUTOCUDA_CACHE_DIR=/tmp/c_old PYTHONPATH=$PWD timeout 280 python3 bench/run.py $ARGS --out /tmp/old > /tmp/old.log 2>&1) || tail -5 /tmp/old.log
AUTOCUDA_CACHE_DIR=/tmp/c_new2 PYTHONPATH=$PWD timeout 280 python3 bench/run.py $ARGS --out /tmp/new > /tmp/new.log 2>&1 || tail -5 /tmp/new.log
cp /tmp/old/results.json $OUT/results_old.json; cp /tmp/new/results.json $OUT/results_new.json; cp /tmp/new/table.txt $OUT/table_new.txt
python3 scratch/ab.py /tmp/old/results.json /tmp/new/results.json | tee $OUT/ab.txt
