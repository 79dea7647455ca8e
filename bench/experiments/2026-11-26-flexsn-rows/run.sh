#!/bin/bash
# One device command: host profile on cores 0-1 while SpikingJelly's FlexSN compiles its kernels for every
# (model, dtype, shape) in parallel on cores 2-15 (Triton's disk cache, shared); then one timing run of the rows
# whose compile finished. Usage: bash run.sh OUT [WARM_LIMIT_S]
OUT=$1; LIMIT=${2:-330}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site TRITON_CACHE_DIR=/tmp/triton-cache
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
mkdir -p $OUT/warm
start=$(date +%s)
for m in alif sfa_lif cuba_lif; do for d in float32 bfloat16; do for s in 8x8M 64x1M 1024x16K; do
  (taskset -c 2-15 timeout $LIMIT python3 bench/flexsn_peer.py --systems sj-flexsn --first-only --models $m \
     --dtypes $d --shapes $s --out $OUT/warm/$m-$d-$s > $OUT/warm/$m-$d-$s.log 2>&1; echo "$m $d $s rc=$? $(( $(date +%s) - start ))s" >> $OUT/warm/done.txt) &
done; done; done
taskset -c 0,1 python3 bench/experiments/2026-11-26-host-profile/profile.py $OUT/profile > $OUT/profile.log 2>&1
echo "profile done at $(( $(date +%s) - start ))s" >> $OUT/warm/done.txt
wait
cat $OUT/warm/done.txt
ready=""
for s in 8x8M 64x1M 1024x16K; do
  if [ -z "$(grep " $s " $OUT/warm/done.txt | grep -v rc=0)" ]; then ready="$ready,$s"; fi
done
ready=${ready#,}
echo "shapes compiled by all: $ready"
taskset -c 0,1 python3 bench/flexsn_peer.py --out $OUT/peer --budget $(( 560 - $(date +%s) + start )) \
  --shapes ${ready:-8x8M} > $OUT/peer.log 2>&1
tail -25 $OUT/peer.log
grep "==" $OUT/profile.log
