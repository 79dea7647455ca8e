"""The benchmark's report: the speed table, the text summary, the plot, and the files of a run."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .workloads import MODES


def count(n: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << (shift + 4) and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _spread(row: Mapping[str, Any]) -> str:
    rounds = row.get("us_per_call_rounds")
    return f" (rounds {min(rounds):.1f}-{max(rounds):.1f})" if rounds else ""


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


STEP_MARK = "*"  # beside a compile time measured with the step compiled, not the whole loop
HEADER = ("workload", "dtype", "mode", "T", "N", "ours ms", "% floor", "SJ ms", "×SJ", "compile ms", "×compile",
          "eager ms", "check")


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The speed table (rows as in the JSON), then the reasons for missing entries with their counts."""
    cells = [list(HEADER)]
    for r in rows:
        step = STEP_MARK if r.get("compile_form") == "step" and r["compile_ms"] else ""
        cells.append([r["workload"], r["dtype"], r["mode"], str(r["T"]), count(r["N"]), fmt(r["ours_ms"], ".3f"),
                      fmt(r["pct_floor"], ".0f"), fmt(r["sj_ms"], ".3f"), fmt(r["x_sj"], ".2f"),
                      fmt(r["compile_ms"], ".3f") + step, fmt(r["x_compile"], ".2f"), fmt(r["eager_ms"], ".3f"),
                      r["check"] + ("" if r.get("sj_check") in (None, "ok") else f" (SJ: {r['sj_check']})")])
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if 3 <= i <= 11 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r["compile_ms"] and r.get("compile_form") == "step" for r in rows):
        lines += ["", f"{STEP_MARK} torch.compile of the step alone, called by a Python loop over T (T > the "
                  "--compile-max-t whose unrolled loop is compiled)"]
    notes = Counter(f"{system}: {why}" for r in rows for system, why in r["notes"].items())
    if notes:
        lines += ["", "missing entries:"] + [f"  {text}  ({n} rows)" for text, n in sorted(notes.items())]
    return "\n".join(lines)


def summary(results: Mapping[str, Any]) -> str:
    """The whole report as text: bandwidth, speed table, memory, host overhead, first use."""
    env = results["environment"]
    out = [f"{env.get('gpu', env['device'])}, driver {env.get('driver')}, torch {env['torch']}, "
           f"autocuda {env['autocuda']} ({env.get('autocuda_commit')}), SpikingJelly {env['spikingjelly']}",
           f"copy bandwidth: {results['copy_bandwidth_GBps']:.0f} GB/s; floor = bytes / bandwidth with "
           "2 (inference) or 6 (training) element accesses per neuron-step", ""]
    if "speed" in results:
        out += [table(results["speed"]), ""]
    if results.get("memory"):
        out.append("memory of a training step, bytes per neuron-step (saved: held from forward to backward, "
                   "outputs excluded; peak: over forward + backward)")
        out += [f"  {r['workload']:<11} {r['dtype']:<8} {r['system']:<4} T={r['T']} N={count(r['N'])}: saved "
                f"{fmt(r.get('saved_bytes_per_step'), '.2f')}, peak {fmt(r.get('peak_bytes_per_step'), '.2f')}"
                f"{'  ' + r['note'] if 'note' in r else ''}" for r in results["memory"]["rows"]]
        out += ([results["memory"]["note"]] if "note" in results["memory"] else []) + [""]
    if results.get("host"):
        out.append("host overhead, LIF T=4 N=4096, wall time per call (inference: calls under one torch.no_grad())")
        out += [f"  {r['system']:<18} {_host_mode(r):<41}: {fmt(r.get('us_per_call'), '.1f')} µs{_spread(r)}"
                f"{'  ' + r['note'] if 'note' in r else ''}" for r in results["host"]["rows"]]
        out.append("")
    if results.get("first_use"):
        out.append("first use in a fresh process (" + results["first_use"]["what"] + ")")
        out += [f"  {r['system']:<11} {r['spec']:<10} {r['cache']}: {fmt(r.get('first_use_s'), '.3f')} s "
                f"(process {r['process_wall_s']:.2f} s){'  ' + r['note'] if 'note' in r else ''}"
                for r in results["first_use"]["rows"]]
    if results.get("network"):
        from .network import format_table

        out += ["", "whole network: a spiking VGG's training step (bench/network.py), median step time "
                "(CUDA events on a GPU)", format_table(results["network"])]
    if results.get("sj_classes"):
        from . import sj_classes

        out += ["", sj_classes.describe(results["sj_classes"]), sj_classes.format_table(results["sj_classes"])]
    return "\n".join(out).rstrip() + "\n"


def _host_mode(row: Mapping[str, Any]) -> str:
    if row["mode"] == "training" and row.get("multithreaded_backward") is False:
        return "training, backward on the calling thread"
    return str(row["mode"])


def plot(results: Mapping[str, Any], path: Path) -> str | None:
    """% of floor and speed-ups per workload and shape (bars: float32 or the first dtype; markers: the others).
    Returns why no plot was written, or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install matplotlib, then `python -m bench --plot RESULTS.json`"
    rows = results.get("speed") or []
    if not rows:
        return "no speed rows to plot"
    metrics = (("pct_floor", "% of memory floor", 100.0, False), ("x_sj", "× faster than SpikingJelly 2.0", 1.0, True),
               ("x_compile", "× faster than torch.compile", 1.0, True))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    shapes = list(dict.fromkeys((r["T"], r["N"]) for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    main = "float32" if "float32" in dtypes else dtypes[0]
    colors = plt.get_cmap("tab10" if len(workloads) <= 10 else "tab20")
    fig, axes = plt.subplots(len(metrics), len(MODES), figsize=(15, 11), squeeze=False)
    width = 0.8 / len(workloads)
    for (key, title, ref_line, log), ax_row in zip(metrics, axes):
        for mode, ax in zip(MODES, ax_row):
            drawn = False
            for i, w in enumerate(workloads):
                for dtype, marker in zip(dtypes, ("s", "x", "+", "^")):
                    points = [(j + (i - (len(workloads) - 1) / 2) * width, r[key]) for j, shape in enumerate(shapes)
                              for r in rows if r["workload"] == w and r["dtype"] == dtype and r["mode"] == mode
                              and (r["T"], r["N"]) == shape and r[key]]
                    if not points:
                        continue
                    xs, ys = zip(*points)
                    drawn = True
                    if dtype == main:
                        ax.bar(xs, ys, width, color=colors(i), label=w)
                    else:
                        ax.plot(xs, ys, marker, color="black", markersize=5, label=dtype if i == 0 else None)
            ax.axhline(ref_line, color="gray", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(shapes)), [f"T={t}\nN={count(n)}" for t, n in shapes])
            ax.set_title(f"{title} — {mode} (bars {main})", fontsize=10)
            if log:
                ax.set_yscale("log")
            if not drawn:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=len(labels) or 1, fontsize=9)
    env = results["environment"]
    fig.suptitle(f"autocuda {env['autocuda']} on {env.get('gpu', env['device'])}, copy bandwidth "
                 f"{results['copy_bandwidth_GBps']:.0f} GB/s; speed-up = peer time / our time", y=0.99, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(results: dict[str, Any], out: Path) -> int:
    """results.json, table.txt (also printed) and plot.png in `out`; 1 when any of our outputs failed its check."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = summary(results)
    (out / "table.txt").write_text(text)
    print(text)
    why = plot(results, out / "plot.png")
    print(f"wrote {out}/results.json, table.txt" + (f"; no plot: {why}" if why else ", plot.png"))
    failed = [r for r in results.get("speed", []) if r["check"].startswith(("FAIL", "error"))]
    return 1 if failed else 0
