"""usage: merge.py TAG OUT: the percost-TAG-gw*.json files of a run (in $WORK, default /tmp/test-time) merged into
one {file: {cpu_s, host_compiled, wall_s}}, costliest first; prints the total CPU-seconds of the test files."""
import glob
import json
import os
import sys

tag, out = sys.argv[1:3]
files: dict[str, dict[str, float]] = {}
for path in glob.glob(os.path.join(os.environ.get("WORK", "/tmp/test-time"), f"percost-{tag}-gw*.json")):
    with open(path) as handle:
        for name, (cpu, compiled, wall) in json.load(handle).items():
            total = files.setdefault(name, {"cpu_s": 0.0, "host_compiled": 0, "wall_s": 0.0})
            total["cpu_s"] += cpu
            total["host_compiled"] += compiled
            total["wall_s"] += wall
merged = {name: {"cpu_s": round(v["cpu_s"], 2), "host_compiled": int(v["host_compiled"]),
                 "wall_s": round(v["wall_s"], 2)}
          for name, v in sorted(files.items(), key=lambda item: -item[1]["cpu_s"])}
with open(out, "w") as handle:
    json.dump(merged, handle, indent=1)
print(round(sum(v["cpu_s"] for v in merged.values()), 1))
