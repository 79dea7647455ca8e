# host floor: the old tree (scratch/old, the settled call) against this one (the keyed call), alternating; GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $PWD/scratch/old $PWD; do PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1; done
for r in 1 2 3; do
  for tree in old new; do
    path=$PWD; [ $tree = old ] && path=$PWD/scratch/old
    (cd $path && PYTHONPATH=$path:/tmp/site timeout 120 python3 -m bench.host_floor --out $OUT/floor-$tree-$r > /dev/null 2>&1)
    echo "== $tree $r"; cat $OUT/floor-$tree-$r/host_floor.txt
  done
done
PYTHONPATH=$PWD:/tmp/site timeout 250 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider -n 8 tests/gpu/test_layer_programs_gpu.py tests/gpu/test_sj_protocol_gpu.py tests/gpu/test_detach_in_place_gpu.py tests/gpu/test_native_gpu.py > $OUT/gpu-tests.log 2>&1
tail -4 $OUT/gpu-tests.log
