#!/bin/bash
# AMP DDP noise: the same bench.ddp run three times (cold caches, then warm), per-step spread and wall time
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-cache TORCHINDUCTOR_CACHE_DIR=/tmp/ind-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
python3 -m autocuda native build --wait > /dev/null 2>&1
S=ours-compiled-ro-cl,ours-fused-nf-compiled-ro-cl,loop-compiled-ro-cl
for run in 1 2 3; do
  extra=""
  if [ $run = 3 ]; then export TORCH_LOGS=perf_hints; fi
  timeout 170 python3 -m bench.ddp --out $OUT/run$run --gpus 1,2 --shape 4x64 --precision bfloat16 --steps 100 \
    --bucket-view --no-sync-buffers --systems $S > $OUT/run$run.log 2>&1
  tail -8 $OUT/run$run.log
  ls /tmp/ac-cache/tuning 2>/dev/null | wc -l
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
grep -i "cudagraph" $OUT/run3.log | sort | uniq -c | head -20
