"""Old tree against new, from two bench results.json of one run on one GPU: speed rows and host rows as ratios."""
import json
import sys

old, new = (json.load(open(p)) for p in sys.argv[1:3])


def speed(d):
    return {(r["spec"], r["dtype"], r["mode"], r["T"], r["N"]): r["ours_ms"] for r in d["speed"]}


def host(d):
    return {(r["system"], r["mode"], r["T"], r["N"]): r["us_per_call"] for r in d.get("host", {}).get("rows", [])}


print(f"GPU: {new['environment'].get('gpu')}  old {old['environment'].get('autocuda_commit')}  "
      f"new {new['environment'].get('autocuda_commit')}")
print(f"{'spec':<11}{'dtype':<9}{'mode':<10}{'T':>5}{'N':>9}{'old ms':>10}{'new ms':>10}{'new/old':>9}")
ratios = []
so, sn = speed(old), speed(new)
for key in sorted(set(so) & set(sn)):
    r = sn[key] / so[key]
    ratios.append(r)
    print(f"{key[0]:<11}{key[1]:<9}{key[2]:<10}{key[3]:>5}{key[4]:>9}{so[key]:>10.4f}{sn[key]:>10.4f}{r:>9.3f}")
ho, hn = host(old), host(new)
print(f"\n{'host system':<28}{'mode':<10}{'old us':>9}{'new us':>9}{'new/old':>9}")
for key in sorted(set(ho) & set(hn)):
    print(f"{key[0]:<28}{key[1]:<10}{ho[key]:>9.1f}{hn[key]:>9.1f}{hn[key] / ho[key]:>9.3f}")
if ratios:
    ratios.sort()
    print(f"\nspeed rows: {len(ratios)}, new/old min {ratios[0]:.3f} median {ratios[len(ratios) // 2]:.3f} "
          f"max {ratios[-1]:.3f}")
