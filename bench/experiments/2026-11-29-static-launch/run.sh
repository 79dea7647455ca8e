#!/bin/bash
# The whole GPU suite, then host_floor.py and the launch-cost table, logs under $OUT.
D=bench/experiments/2026-11-29-static-launch
SUITE_SECONDS=${SUITE_SECONDS:-420} bash bench/experiments/2026-11-27-final28/gpu_suite.sh
export PYTHONPATH=$PWD:/tmp/site
python3 $D/launch_cost.py $OUT > $OUT/launch_cost.txt 2>&1; tail -12 $OUT/launch_cost.txt
python3 bench/host_floor.py --out $OUT --calls 1000 > $OUT/host_floor.log 2>&1; tail -8 $OUT/host_floor.log
