# The GPU suite in one command on the lent machine: wheels from .whl (SpikingJelly 2.0, NIR, pytest-xdist),
# xdist workers stealing single tests (not whole files: test_runtime_gpu alone outlasts 200 s on one worker).
# Phase 1 runs the files and cases this session changed, phase 2 everything; one log each under $OUT, the
# summary last.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
run() {  # name, seconds, pytest arguments
  local name=$1 seconds=$2; shift 2
  timeout "$seconds" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 16 --dist worksteal "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$OUT/$name.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/$name.log" | head -30
}
run changed "${CHANGED_SECONDS:-200}" tests/gpu/test_sj_gpu.py tests/gpu/test_reliability_gpu.py \
  tests/gpu/test_batchnorm_gpu.py tests/gpu/test_flexsn_gpu.py tests/gpu/test_nir_gpu.py \
  $(ls tests/gpu/test_inputs_gpu.py 2>/dev/null) \
  "tests/gpu/test_runtime_gpu.py::test_kernels_match_reference"
run rest "${REST_SECONDS:-240}" tests/gpu --deselect tests/gpu/test_sj_gpu.py --deselect tests/gpu/test_reliability_gpu.py \
  --deselect tests/gpu/test_batchnorm_gpu.py --deselect tests/gpu/test_flexsn_gpu.py --deselect tests/gpu/test_nir_gpu.py \
  --deselect tests/gpu/test_inputs_gpu.py --deselect "tests/gpu/test_runtime_gpu.py::test_kernels_match_reference"
