D=bench/experiments/2026-11-25-h100-network
pip install --no-deps --target /tmp/sj scratch/wheels/spikingjelly-2.0.0-py3-none-any.whl scratch/wheels/loguru-0.7.3-py3-none-any.whl > /dev/null 2>&1
for i in 1 2; do for tree in headtree optree; do
  echo "== $tree" >> $OUT/ours_ab.txt
  PYTHONPATH=scratch/$tree timeout 120 python3 $D/compiled_host.py 4x64 ours 2>/dev/null >> $OUT/ours_ab.txt
done; done
PYTHONPATH=scratch/optree timeout 100 python3 $D/op_overhead.py 2>&1 | tail -6 > $OUT/op_overhead.txt
PYTHONPATH=scratch/optree:/tmp/sj timeout 330 python3 bench/network.py --out $OUT/net4 --shapes 4x64 --systems ours,ours-compiled,loop-compiled,sj,sj-flexsn,loop > $OUT/net4.log 2>&1
cat $OUT/ours_ab.txt $OUT/op_overhead.txt $OUT/net4/network.txt; tail -3 $OUT/net4.log
