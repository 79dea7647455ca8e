#!/bin/bash
# Host timings first (nothing else running), then the whole GPU suite; logs under $OUT.
D=bench/experiments/2026-11-29-static-launch
export PYTHONPATH=$PWD
python3 $D/host_parts.py $OUT > $OUT/host_parts.txt 2>&1; tail -16 $OUT/host_parts.txt
python3 bench/host_floor.py --out $OUT > $OUT/host_floor.log 2>&1; tail -7 $OUT/host_floor.log
SUITE_SECONDS=${SUITE_SECONDS:-420} bash bench/experiments/2026-11-27-final28/gpu_suite.sh
