#!/bin/bash
# usage: warm.sh NAME: run cold.sh's tree NAME again, with the caches its cold run left; logs to $WORK/NAME-warm.log.
set -u
name=$1; work=${WORK:-/tmp/test-time}; python=${PYTHON:-python}
caches=$(ls -d "$work"/cache-"$name"-* | head -1)
export AUTOCUDA_CACHE_DIR=$caches/autocuda TORCHINDUCTOR_CACHE_DIR=$caches/inductor MPLCONFIGDIR=$caches/mpl
cd "$work/src-$name" && PYTHONPATH=$PWD /usr/bin/time -v "$python" -m pytest -q -n auto --durations=30 \
    > "$work/$name-warm.log" 2>&1
echo "exit $?" >> "$work/$name-warm.log"
