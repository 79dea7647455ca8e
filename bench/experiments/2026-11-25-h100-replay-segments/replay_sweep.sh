#!/bin/bash
# ALIF training with checkpoints every K steps (K=1: every step, no replay), LIF as the control, ours alone.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for K in ${KS:-1 8 16 32}; do
  AUTOCUDA_CACHE_DIR=/tmp/cache$K python3 -c "
import sys, runpy, autocuda.codegen.neuron as m
m.REPLAY_STEPS = $K
sys.argv = ['bench/run.py'] + sys.argv[1:]
runpy.run_path('bench/run.py', run_name='__main__')" --workloads ${WL:-lif,alif} --dtypes ${DT:-float32} --shapes ${SH:-1024x16K,256x64K,64x1M,8x8M} \
    --parts speed --modes training --no-peers --out /tmp/k$K > /tmp/k$K.log 2>&1 || { echo "K=$K failed"; tail -30 /tmp/k$K.log; }
  cp /tmp/k$K/results.json $OUT/k$K.json
done
python3 - <<'PY'
import json, os
ks = os.environ.get("KS", "1 8 16 32").split()
res = {k: {(r["workload"], r["dtype"], r["T"], r["N"]): r for r in json.load(open(f"/tmp/k{k}/results.json"))["speed"]} for k in ks}
print("workload dtype T N | " + " | ".join(f"K={k} ms (%floor)" for k in ks))
for key in res[ks[0]]:
    print(*key, "|", " | ".join(f"{res[k][key]['ours_ms']:.3f} ({res[k][key]['pct_floor']:.1f}) {res[k][key]['check']}" for k in ks))
PY
