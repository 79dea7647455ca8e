#!/bin/bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-cache TORCHINDUCTOR_CACHE_DIR=/tmp/ind-cache
S=ours-compiled-ro-cl,ours-fused-nf-compiled-ro-cl,loop-compiled-ro-cl
for opt in no_optimization ddp_optimizer; do
  timeout 140 python3 -m bench.ddp --out $OUT/f32-$opt --gpus 1,2 --shape 4x64 --precision float32 --steps 100 \
    --bucket-view --no-sync-buffers --ddp-optimizer $opt --systems $S 2>&1 | tail -7
done
