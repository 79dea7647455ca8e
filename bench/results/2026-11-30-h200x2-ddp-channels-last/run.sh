#!/bin/bash
# DDP compiled with CUDA graphs: store_final_states=False systems against ours and the loop, 1 and 2 GPUs
set -u
PREC=$1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site AUTOCUDA_CACHE_DIR=/tmp/ac-cache TORCHINDUCTOR_CACHE_DIR=/tmp/ind-cache
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 -m autocuda native build --wait > /dev/null 2>&1
timeout 560 python3 -m bench.ddp --out $OUT/ddp-$PREC --gpus 1,2 --shape 4x64 --precision $PREC --steps 20 \
  --bucket-view --no-sync-buffers \
  --systems ours-compiled-ro-cl,ours-nf-compiled-ro-cl,ours-fused-nf-compiled-ro-cl,loop-compiled-ro-cl 2>&1 | tail -30
