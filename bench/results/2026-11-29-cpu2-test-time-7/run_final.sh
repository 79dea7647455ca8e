#!/bin/bash
# usage: run_final.sh REPO COMMIT NAME: cold.sh (beside it) with its percost plugin (-p percost),
# PYTHONDONTWRITEBYTECODE unset, `uptime` before and after (into $WORK/uptime-NAME.txt) and others.py sampling the
# CPU time of processes outside the run (into $WORK/others-NAME.json). WORK defaults to /tmp/test-time.
set -u
repo=$1; commit=$2; name=$3
here=$(cd "$(dirname "$0")" && pwd); work=${WORK:-/tmp/test-time}; mkdir -p "$work"
rm -f "$work/stop-$name"
python3 "$here/others.py" "$work/src-$name" "$work/stop-$name" "$work/others-$name.json" &
uptime > "$work/uptime-$name.txt"
WORK=$work env -u PYTHONDONTWRITEBYTECODE bash "$here/cold.sh" "$repo" "$commit" "$name" \
    -p percost
uptime >> "$work/uptime-$name.txt"
touch "$work/stop-$name"; wait
