#!/bin/bash
# OTTT/SLTT old (scratch/old: c0f0fe0) against new, alternating, each in its own processes (run from the repository
# root on the device; the same device call then ran ../2026-11-28-h200-compile-default/profile_compile.py).
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $HERE/scratch/old $HERE; do PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1; done
for r in 1 2; do for t in old new; do
  path=$HERE; [ $t = old ] && path=$HERE/scratch/old
  echo "== online $t $r"
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 150 python3 -m bench.sj_classes --classes OTTTLIFNode,SLTTLIFNode 2>&1 | tail -5)
done; done
