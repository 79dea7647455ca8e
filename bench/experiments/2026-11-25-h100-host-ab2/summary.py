"""Per case: min and median over processes of each tree's per-process min and median, and ratios to 'old'."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
trees = list(dict.fromkeys(r["tree"] for r in rows))
cases = [k for k in rows[0] if k != "tree"]
print(f"{'case':<22}{'stat':<8}" + "".join(f"{t + ': min / median (us)':<30}" for t in trees) + "  median ratio to old")
for case in cases:
    for stat in ("min", "median"):
        by = {t: [r[case][stat] for r in rows if r["tree"] == t] for t in trees}
        cells = "".join(f"{min(v):7.1f} / {statistics.median(v):7.1f} (n={len(v)}){'':<8}" for v in by.values())
        ratios = " ".join(f"{t} {statistics.median(v) / statistics.median(by['old']):.3f}" for t, v in by.items()
                          if t != "old")
        print(f"{case:<22}{stat:<8}{cells}  {ratios}")
