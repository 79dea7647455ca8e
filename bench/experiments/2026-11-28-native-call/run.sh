#!/usr/bin/env bash
# One device call: the native library built there, host time of a small call with and without the native path
# (two rounds each, alternating), then the native and runtime GPU tests.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import time, torch; from autocuda import native; t=time.time(); print(native.ensure(), native.status(), round(time.time()-t, 1), 's'); print(torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee $OUT/build.log
for round in 1 2; do
  AUTOCUDA_NATIVE=1 python3 bench/host_floor.py --out $OUT/native$round 2>&1 | tee -a $OUT/host.log
  AUTOCUDA_NATIVE=0 python3 bench/host_floor.py --out $OUT/python$round 2>&1 | tee -a $OUT/host.log
done
python3 -m pytest -q -m gpu tests/gpu/test_native_gpu.py tests/gpu/test_runtime_gpu.py 2>&1 | tee $OUT/tests.log | tail -15
