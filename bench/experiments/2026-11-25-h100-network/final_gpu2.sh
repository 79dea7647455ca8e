# Follow-up: the runtime suite's other tests (torch.compile, graphs, streams with the ops' direct kernels),
# the failures of the first run in detail, and the corrected FlexSN comparison.
pip install --no-deps --target /tmp/sj scratch/wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/sj
run() { timeout $1 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --tb=line "${@:2}" > $OUT/log.txt 2>&1; echo "rc=$? $*"; grep -E "^(FAILED|ERROR)|Error:|assert|passed|failed" $OUT/log.txt | cut -c1-300 | head -12; }
run 45 tests/gpu/test_sj_gpu.py
run 45 tests/gpu/test_runtime_gpu.py -k "test_kernels_match_reference and raf"
run 45 tests/gpu/test_flexsn_gpu.py -k "matches_spikingjelly and (float64 or float32)"
run 150 tests/gpu/test_runtime_gpu.py -k "not test_kernels_match_reference"
