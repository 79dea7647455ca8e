#!/bin/bash
# The whole GPU suite (two-GPU tests included where the machine has two), logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
python3 -m compileall -q autocuda /tmp/site > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
git log --oneline -1 | tee -a $OUT/device.txt
timeout "${SUITE_SECONDS:-480}" python3 -m pytest -m gpu -v -p no:cacheprovider -rfE -n 16 --dist worksteal tests/gpu \
  > $OUT/suite.log 2>&1
echo "suite rc=$?"
grep -cE " PASSED" $OUT/suite.log; grep -E "(FAILED|ERROR) " $OUT/suite.log | head -30; tail -3 $OUT/suite.log
