# issue 44 step: the old tree (scratch/old = 95630a8) against this one, alternating: host floor and host-bound calls;
# then the ops' native plans under torch.compile, toggled in one process.
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $PWD/scratch/old $PWD; do PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1; done
for r in 1 2 3; do
  for tree in old new; do
    path=$PWD; [ $tree = old ] && path=$PWD/scratch/old
    (cd $path && PYTHONPATH=$path:/tmp/site timeout 100 python3 -m bench.host_floor --out $OUT/floor-$tree-$r > /dev/null 2>&1)
    echo "== floor $tree $r"; cat $OUT/floor-$tree-$r/host_floor.txt
    echo "== calls $tree $r"; (cd $path && PYTHONPATH=$path:/tmp/site timeout 100 python3 $HERE/scratch/plif_time.py 2>&1 | tee $OUT/calls-$tree-$r.txt)
  done
done
echo "== compiled, ops by native plans (native.USE on) against the Python launch (off)"
PYTHONPATH=$PWD:/tmp/site timeout 200 python3 scratch/compiled_ab.py $OUT/compiled_ab.json 2>&1 | tail -8
for tree in old new; do
  path=$HERE; [ $tree = old ] && path=$HERE/scratch/old
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 150 python3 -m bench.network --systems ours-compiled,ours --precisions float32,bfloat16 --shapes 4x64 --steps 50 --out $OUT/net-$tree > $OUT/net-$tree.log 2>&1)
  echo "== network $tree"; cat $OUT/net-$tree/network.txt 2>/dev/null || tail -5 $OUT/net-$tree.log
done
