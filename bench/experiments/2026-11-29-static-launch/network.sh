#!/bin/bash
# bench/network.py after prepared calls, the static launcher and the fused layer's two backward passes: our rows
# and SpikingJelly's in both precisions and shapes, then the compiled plain loop at 4x64; logs under $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 330 python3 bench/network.py --out $OUT/main --systems ours,ours-fused,ours-compiled-ro,ours-fused-compiled-ro,sj \
  > $OUT/main.log 2>&1
echo "main rc=$?"
timeout 200 python3 bench/network.py --out $OUT/loop --systems loop-compiled-ro --shapes 4x64 > $OUT/loop.log 2>&1
echo "loop rc=$?"
grep -h '^{' $OUT/main.log $OUT/loop.log | cut -c1-300
