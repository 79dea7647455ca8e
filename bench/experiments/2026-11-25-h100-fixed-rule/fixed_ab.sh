#!/bin/bash
# The long loops' fixed rule, old (scratch/old: HEAD) against new, then the GPU suite on the new tree.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
M=lif,parametric_lif,qif,eif,izhikevich,adex
(cd scratch/old && AUTOCUDA_CACHE_DIR=/tmp/f_old PYTHONPATH=$PWD timeout 150 python3 ../fixed_rule.py $M) > $OUT/fixed_old.txt 2>&1
AUTOCUDA_CACHE_DIR=/tmp/f_new PYTHONPATH=$PWD timeout 150 python3 scratch/fixed_rule.py $M > $OUT/fixed_new.txt 2>&1
paste -d'\n' $OUT/fixed_old.txt $OUT/fixed_new.txt | tee $OUT/fixed_rule.txt
PYTHONPATH=$PWD timeout 280 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/gpu 2>&1 | tail -12 > $OUT/gpu_suite.txt
tail -3 $OUT/gpu_suite.txt
