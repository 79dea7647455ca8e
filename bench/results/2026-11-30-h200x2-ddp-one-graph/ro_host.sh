#!/bin/bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-cache TORCHINDUCTOR_CACHE_DIR=/tmp/ind-cache
python3 -m autocuda native build --wait > /dev/null 2>&1
timeout 400 python3 bench/results/2026-11-30-h200x2-ddp-one-graph/ro_host.py > $OUT/ro_host.txt 2>&1
grep -E "^==|^  " $OUT/ro_host.txt | grep -v "^    " | head -60
