#!/bin/bash
# usage: cold.sh REPO COMMIT NAME [pytest args]: the default test run of COMMIT from a fresh export, every cache
# empty; logs to $WORK/NAME.log (WORK defaults to /tmp/test-time). Run from any folder; needs the venv's python.
set -u
repo=$1; commit=$2; name=$3; shift 3
work=${WORK:-/tmp/test-time}; here=$(cd "$(dirname "$0")" && pwd); python=${PYTHON:-python}
src=$work/src-$name; rm -rf "$src"; mkdir -p "$src"
git -C "$repo" archive "$commit" | tar -x -C "$src"
caches=$(mktemp -d "$work/cache-$name-XXXX")
export AUTOCUDA_CACHE_DIR=$caches/autocuda TORCHINDUCTOR_CACHE_DIR=$caches/inductor MPLCONFIGDIR=$caches/mpl
cd "$src" && PYTHONPATH=$src:$here PERCOST_TAG=$name PERCOST_DIR=$work /usr/bin/time -v "$python" -m pytest -q \
    -n auto --durations=40 "$@" > "$work/$name.log" 2>&1
echo "exit $?" >> "$work/$name.log"
