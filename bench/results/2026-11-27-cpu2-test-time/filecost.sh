#!/bin/bash
# usage: filecost.sh REPO COMMIT NAME TESTFILE... [-- pytest args]: the test files of COMMIT, cold (a fresh export,
# every cache empty), in one process (no xdist); /usr/bin/time's figures and pytest's summary to $WORK/NAME.log.
set -u
repo=$1; commit=$2; name=$3; shift 3
work=${WORK:-/tmp/test-time}; python=${PYTHON:-python}
src=$work/src-$name; rm -rf "$src"; mkdir -p "$src"
git -C "$repo" archive "$commit" | tar -x -C "$src"
caches=$(mktemp -d "$work/cache-$name-XXXX")
export AUTOCUDA_CACHE_DIR=$caches/autocuda TORCHINDUCTOR_CACHE_DIR=$caches/inductor MPLCONFIGDIR=$caches/mpl
cd "$src" && PYTHONPATH=$src /usr/bin/time -v "$python" -m pytest -q -p no:xdist "$@" > "$work/$name.log" 2>&1
echo "exit $?" >> "$work/$name.log"
