# Alternate old and new tree processes, each pinned to one core with one OpenMP thread, separate caches.
set -u
export OMP_NUM_THREADS=1
for i in $(seq 1 12); do
  for tree in ${TREES:-old new}; do
    AUTOCUDA_CACHE_DIR=/tmp/cache_$tree taskset -c 3 python3 bench/experiments/2026-11-25-h100-host-ab2/host_ab.py \
      scratch/${tree}tree $tree >> $OUT/host_ab.jsonl 2>> $OUT/host_ab.err
  done
done
python3 bench/experiments/2026-11-25-h100-host-ab2/summary.py $OUT/host_ab.jsonl | tee $OUT/host_ab_summary.txt
