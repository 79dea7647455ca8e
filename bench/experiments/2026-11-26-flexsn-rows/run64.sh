#!/bin/bash
# SpikingJelly FlexSN at (64, 1M): each of its four autotuning configurations compiled by its own process (all
# models and dtypes at once, 24 processes on 16 cores, shared Triton cache), then one timing run of the
# (model, dtype) rows whose four compiles finished. Usage: bash run64.sh OUT [WARM_LIMIT_S]
OUT=$1; LIMIT=${2:-400}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site TRITON_CACHE_DIR=/tmp/triton-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
mkdir -p $OUT/w
start=$(date +%s)
for m in alif sfa_lif cuba_lif; do for d in float32 bfloat16; do for i in 0 1 2 3; do
  (timeout $LIMIT python3 bench/experiments/2026-11-26-flexsn-rows/warm_config.py $i --models $m --dtypes $d \
     --shapes 64x1M --out /tmp/w/$m-$d-$i > /tmp/w-$m-$d-$i.log 2>&1; echo "$m $d $i rc=$? $(( $(date +%s) - start ))s" >> $OUT/w/done.txt) &
done; done; done
wait
sort $OUT/w/done.txt
for m in alif sfa_lif cuba_lif; do for d in float32 bfloat16; do
  if [ "$(grep -c "^$m $d .* rc=0 " $OUT/w/done.txt)" = 4 ]; then
    left=$(( 570 - $(date +%s) + start ))
    [ $left -lt 40 ] && { echo "$m $d: no time left"; continue; }
    timeout $left python3 bench/flexsn_peer.py --out /tmp/peer-$m-$d --models $m --dtypes $d --shapes 64x1M \
      --budget 1 > /tmp/peer-$m-$d.log 2>&1
    tail -1 /tmp/peer-$m-$d/table.md
  else echo "$m $d: not compiled"; fi
done; done
cat /tmp/peer-*/progress.jsonl > $OUT/progress.jsonl 2>/dev/null; tail -n 5 /tmp/peer-*.log > $OUT/peer_logs.txt 2>/dev/null
tail -3 /tmp/w-alif-float32-0.log
