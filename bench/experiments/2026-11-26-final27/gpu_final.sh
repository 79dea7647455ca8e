#!/bin/bash
# The session's last device command: FlexSN first use (warm and cold, with and without torch's own first use
# counted), then the whole GPU suite (two-GPU tests included where the machine has two), logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
python3 -m compileall -q autocuda /tmp/site > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout 80 python3 bench/flexsn_first_use.py --device cuda --repeat 2 --warm 5 --out $OUT/fu > $OUT/first_use.log 2>&1
tail -6 $OUT/first_use.log
timeout 50 python3 bench/flexsn_first_use.py --device cuda --repeat 1 --warm 5 --warm-torch --out $OUT/fuwt \
  > $OUT/first_use_warm_torch.log 2>&1
tail -6 $OUT/first_use_warm_torch.log
timeout "${SUITE_SECONDS:-400}" python3 -m pytest -m gpu -v -p no:cacheprovider -rfE -n 16 --dist worksteal tests/gpu \
  > $OUT/suite.log 2>&1
echo "suite rc=$?"
grep -cE " PASSED" $OUT/suite.log; grep -E "(FAILED|ERROR) " $OUT/suite.log | head -30; tail -3 $OUT/suite.log
