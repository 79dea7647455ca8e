# The whole GPU suite in one command on the lent machine: wheels from .whl (SpikingJelly 2.0, NIR, pytest-xdist),
# 12 xdist workers stealing single tests (not whole files: test_runtime_gpu alone outlasts 200 s on one worker),
# one log per run under $OUT and the summary last.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
timeout ${SUITE_SECONDS:-480} python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --dist worksteal tests/gpu \
  > $OUT/gpu_suite.log 2>&1
echo "gpu suite rc=$?"
grep -E "^(FAILED|ERROR)" $OUT/gpu_suite.log | head -40
tail -3 $OUT/gpu_suite.log
