#!/bin/bash
# Old tree (scratch/old: d8b6e37) against the working tree, alternating, each in its own processes: host time of a small
# LIF call against a bare autograd.Function (bench.host_floor), native path then the Python path; STBIF's host part.
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $HERE/scratch/old $HERE; do PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1; done
run() {  # tree label, extra env
  local path=$HERE; [ $1 = old ] && path=$HERE/scratch/old
  echo "== $1 $2"
  (cd $path && env $3 PYTHONPATH=$path:/tmp/site timeout 200 python3 -m bench.host_floor --out $OUT/hf-$1-$2 --repeats 5 2>&1 | tail -8)
}
for r in 1 2; do for t in old new; do run $t native-$r "AUTOCUDA_NATIVE=1"; done; done
for t in old new; do run $t python "AUTOCUDA_NATIVE=0"; done
for r in 1 2; do for t in old new; do
  path=$HERE; [ $t = old ] && path=$HERE/scratch/old
  echo "== stbif $t $r"; (cd $path && PYTHONPATH=$path:/tmp/site timeout 100 python3 $HERE/scratch/stbif_host.py 2>&1 | head -6)
done; done
