"""Host time per call, old tree against new, from interleaved bench runs (results.json paths: old... -- new...)."""
import json
import statistics
import sys

split = sys.argv.index("--")
groups = {"old": sys.argv[1:split], "new": sys.argv[split + 1:]}
times: dict = {}
for tree, paths in groups.items():
    for path in paths:
        for row in json.load(open(path))["host"]["rows"]:
            if "us_per_call" in row:
                key = (row["system"], row["mode"], row["multithreaded_backward"])
                times.setdefault(key, {}).setdefault(tree, []).append(row["us_per_call"])
print(f"{'system':<22}{'mode':<10}{'mt':<4}{'old us (runs)':<28}{'new us (runs)':<28}{'median new/old':>14}")
for key, by_tree in times.items():
    old, new = by_tree.get("old", []), by_tree.get("new", [])
    if old and new:
        ratio = statistics.median(new) / statistics.median(old)
        print(f"{key[0]:<22}{key[1]:<10}{str(key[2])[0]:<4}{' '.join(f'{t:.1f}' for t in old):<28}"
              f"{' '.join(f'{t:.1f}' for t in new):<28}{ratio:>14.3f}")
