# The session's last GPU run: NIR and network benchmarks, then the GPU suite file by file (changed areas first).
pip install --no-deps --target /tmp/sj scratch/wheels/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/sj
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
timeout 100 python3 bench/nir_mlp.py --out $OUT/nir > $OUT/nir.log 2>&1; tail -8 $OUT/nir.log
timeout 70 python3 bench/network.py --out $OUT/net --shapes 4x64 --systems ours,ours-fused --steps 20 > $OUT/net.log 2>&1; cat $OUT/net/network.txt
for f in test_runtime_gpu test_builder_gpu test_batchnorm_gpu test_nir_gpu test_sj_gpu test_flexsn_gpu test_cupy_gpu \
         test_foreign_arrays_gpu test_tools_gpu test_reliability_gpu; do
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/gpu/$f.py -k "not matches_spikingjelly or float32" -s \
    > $OUT/$f.log 2>&1
  echo "$f rc=$? $(tail -1 $OUT/$f.log)"
done
