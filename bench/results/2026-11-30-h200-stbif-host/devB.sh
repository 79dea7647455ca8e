#!/bin/bash
# The committed tree before the host trims (scratch/oldnoise: 26844c0) and the working tree after them, alternating:
# SpikingJelly's classes against ours (STBIF, ActivationAwareIF, PSN), then stbif_host.py.
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $HERE/scratch/oldnoise $HERE; do PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1; done
for r in 1 2; do for tree in old new; do
  path=$HERE; [ $tree = old ] && path=$HERE/scratch/oldnoise
  echo "== $tree $r"
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 150 python3 -m bench.sj_classes --classes STBIFNode,ActivationAwareIFNode,PSN 2>&1 | grep -v -i warn | tail -8)
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 100 python3 $HERE/scratch/stbif_host.py 2>&1 | head -6)
done; done 2>&1 | tee $OUT/sj_ab.txt
