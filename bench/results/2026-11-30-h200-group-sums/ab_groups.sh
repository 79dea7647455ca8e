#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
NEW=$PWD; OLD=$PWD/scratch/old
for r in 1 2; do for tree in old new; do
  dir=$([ $tree = old ] && echo $OLD || echo $NEW)
  (cd $dir && PYTHONPATH=$dir:/tmp/site python3 -m bench.noise --dtypes float32,bfloat16 --out $OUT/noise-$tree-$r > $OUT/noise-$tree-$r.txt 2>&1)
  (cd $dir && PYTHONPATH=$dir:/tmp/site python3 $NEW/scratch/plif_ab.py > $OUT/plif-$tree-$r.txt 2>&1)
done; done
grep -h "" $OUT/noise-*.txt $OUT/plif-*.txt | head -80
