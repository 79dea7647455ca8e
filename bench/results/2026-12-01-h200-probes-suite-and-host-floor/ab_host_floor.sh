#!/bin/bash
# host_floor A/B on the device: old tree (scratch/ab_old, 13884c1) against this checkout, alternating, own caches.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for tree in ${TREES:-old new old new}; do
  if [ $tree = old ]; then root=$PWD/scratch/ab_old; else root=$PWD; fi
  n=$(ls $OUT | grep -c "^$tree" || true)
  (cd $root && PYTHONPATH=$root:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-$tree timeout 280 python3 -m bench.host_floor ${FLOOR_ARGS:-} --out $OUT/${tree}_$n > $OUT/${tree}_$n.log 2>&1)
  echo "== $tree $n"; tail -8 $OUT/${tree}_$n.log
done
