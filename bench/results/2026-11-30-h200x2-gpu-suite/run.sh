#!/bin/bash
# GPU suite on the device: wheels from .whl, logs under $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-cache
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider -n 16 --dist worksteal --durations=20 "$@" tests/gpu > $OUT/gpu_suite.log 2>&1
grep -v PASSED $OUT/gpu_suite.log | tail -60
