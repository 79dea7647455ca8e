#!/bin/bash
# The tree before the keyed single steps (scratch/old: 22abc88) and the working tree, alternating, each in its own
# process: scratch/step_ab.py.
set -u
HERE=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export AUTOCUDA_CACHE_DIR=/tmp/ac-cache
for tree in $HERE/scratch/old $HERE; do (cd $tree && PYTHONPATH=$tree:/tmp/site python3 -m autocuda native build --wait > /dev/null 2>&1); done
for r in 1 2 3; do for t in old new; do
  path=$HERE; [ $t = old ] && path=$HERE/scratch/old
  (cd $path && PYTHONPATH=$path:/tmp/site timeout 120 python3 $HERE/scratch/step_ab.py $t 2>&1 | tail -1)
done; done
