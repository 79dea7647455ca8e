#!/usr/bin/env bash
# One device call: the native library built there; host time of a small call (module and functional) with the
# native path on and off
# (alternating, two rounds each, before anything else loads the host); then the whole GPU suite with it on.
# TESTS names a part of the GPU suite (default: all of it). At most 8 files come back: device.txt, host.log, four host_floor_*.json, suite.log.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log --oneline -1 | tee -a $OUT/device.txt
python3 -c "import time, torch; from autocuda import native; t=time.time(); print(native.ensure(), native.status(), round(time.time()-t, 1), 's'); print(torch.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a $OUT/device.txt
for round in 1 2; do
  AUTOCUDA_NATIVE=1 python3 bench/host_floor.py --out /tmp/hf/native$round 2>&1 | tee -a $OUT/host.log
  AUTOCUDA_NATIVE=0 python3 bench/host_floor.py --out /tmp/hf/python$round 2>&1 | tee -a $OUT/host.log
done
for d in /tmp/hf/*; do cp $d/host_floor.json $OUT/host_floor_$(basename $d).json; done
export AUTOCUDA_NATIVE=1
timeout "${SUITE_SECONDS:-440}" python3 -m pytest -m gpu -v -p no:cacheprovider -rfE -n 16 --dist worksteal ${TESTS:-tests/gpu} \
  > $OUT/suite.log 2>&1
echo "suite rc=$?"
grep -cE " PASSED" $OUT/suite.log; grep -E "(FAILED|ERROR) " $OUT/suite.log | head -30; tail -3 $OUT/suite.log
cat /tmp/hf/*/host_floor.txt
