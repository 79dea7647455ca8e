"""Old and new tree's benchmark JSON side by side: % of the floor and new/old time per row (ours)."""
import json
import sys

old, new = (json.load(open(path)) for path in sys.argv[1:3])


def rows(results):
    return {(r["workload"], r["dtype"], r["mode"], r["T"], r["N"]): r for r in results["speed"]}


before, after = rows(old), rows(new)
print(f"copy bandwidth: old {old['copy_bandwidth_GBps']:.0f} GB/s, new {new['copy_bandwidth_GBps']:.0f} GB/s")
for key, r in after.items():
    o = before.get(key)
    if o is None or not o.get("ours_ms") or not r.get("ours_ms"):
        continue
    print(f"{key[0]:14s} {key[1]:9s} {key[2]:9s} T={key[3]:5d} N={key[4]:8d}: old {o['pct_floor']:5.1f}% "
          f"new {r['pct_floor']:5.1f}% new/old {r['ours_ms'] / o['ours_ms']:.3f} (check {r['check']})")
for part in ("old", "new"):
    for m in (old if part == "old" else new).get("memory", {}).get("rows", []):
        print(part, "memory", m.get("workload"), m.get("dtype"), m.get("system"),
              {k: round(v, 2) for k, v in m.items() if k.endswith("per_step")}, m.get("note", ""))
