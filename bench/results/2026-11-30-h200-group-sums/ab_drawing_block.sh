#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
NEW=$PWD; OLD=$PWD/scratch/old
for r in 1 2; do for tree in old new; do
  dir=$([ $tree = old ] && echo $OLD || echo $NEW)
  echo "== $tree $r" >> $OUT/ab.txt
  (cd $dir && AUTOCUDA_CACHE_DIR=/tmp/ac-$tree PYTHONPATH=$dir:/tmp/site python3 -m bench.noise --dtypes float32,bfloat16 >> $OUT/ab.txt 2>&1)
done; done
cat $OUT/ab.txt
AUTOCUDA_CACHE_DIR=/tmp/ac-new PYTHONPATH=$NEW:/tmp/site python3 -m pytest -q -p no:cacheprovider -n 8 tests/gpu/test_noise_gpu.py tests/gpu/test_group_sums_gpu.py tests/gpu/test_runtime_gpu.py -k "noise or noisy or draw or group or tuning or layout" > $OUT/gpu.txt 2>&1
tail -3 $OUT/gpu.txt
