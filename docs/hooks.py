"""Documentation made from the code: sections of the committed pages, and pages and pictures the site build adds.

Sections of docs/*.md between `<!-- autocuda:NAME -->` and `<!-- autocuda:end -->` are written by `SECTIONS`
into the committed Markdown, so that the pages read whole on GitHub too; `python docs/hooks.py` rewrites them
after the code changed (tests/test_docs.py fails while one is stale):
- `spec-errors`: a table of spec mistakes and the SpecError each one raises;
- `shipped-specs`: the shipped specs with their one-line docs;
- `bench-results`: the newest `bench/results/*/results.json` as a table (the site adds its plot).

Made by the site build alone (the MkDocs hooks below), never committed:
- `img/surrogates/<Name>.png`: each surrogate's primitive (with the Heaviside step) and its gradient;
- `gallery/<spec>.md`: a shipped spec's TOML and the CUDA source autocuda generates for it;
- `img/plots/<name>.png`: shipped neurons driven by test inputs, and f-I curves (autocuda.plot, `TOOL_PLOTS`).

The functions that produce content are plain (no MkDocs objects) so that tests can call them.
"""
from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _use_checkout() -> None:
    """Import this checkout's package, installed or not (MkDocs restores sys.path after loading hooks)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


_use_checkout()

log = logging.getLogger("mkdocs.hooks.autocuda")

# -- surrogate plots ----------------------------------------------------------------------------------------
PLOT_RANGE = {"LogTailedReLU": (-1.0, 4.0), "FakeNumericalGradient": (-8.0, 8.0)}  # others: [-3, 3]


def surrogate_names() -> list[str]:
    from autocuda.spec.surrogate import SURROGATES

    return [name for name in SURROGATES if name != "Custom"]


def surrogate_plot(name: str) -> bytes:
    """PNG of the surrogate `name` at its default parameters: primitive and Θ (left), gradient (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import sympy
    import torch

    from autocuda.spec.surrogate import SURROGATES
    from autocuda.spec.torch_eval import evaluate

    X = sympy.Symbol("x", real=True)  # the surrogates' variable

    surrogate = SURROGATES[name]()
    low, high = PLOT_RANGE.get(name, (-3.0, 3.0))
    x = torch.linspace(low, high, 1201, dtype=torch.float64)
    gradient = surrogate.torch_gradient(x).expand_as(x)
    primitive = surrogate.primitive(X)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.7))
    left.plot(x, (x >= 0).double(), color="0.6", linestyle="--", label="Θ(x) (forward)")
    if primitive is not None:
        left.plot(x, evaluate(primitive, {X: x}).expand_as(x), color="C0", label="primitive")
    else:
        left.text(0.5, 0.5, "no documented primitive", transform=left.transAxes, ha="center", color="C0")
    left.set_title(f"{surrogate!r}", fontsize=10)
    left.legend(loc="upper left", fontsize=8)
    right.plot(x, gradient, color="C1")
    right.set_title("gradient used in backward", fontsize=10)
    for ax in (left, right):
        ax.axvline(0, color="0.85", linewidth=0.8, zorder=0)
        ax.set_xlabel("x = h - threshold")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    return buffer.getvalue()


# -- responses of shipped neurons (autocuda.plot) ---------------------------------------------------------------
# img/plots/<name>.png -> (spec, what: an input of autocuda.plot.INPUTS, or "fi" for the f-I curve, parameters)
TOOL_PLOTS: dict[str, tuple[str, str, dict[str, float]]] = {
    "lif-step": ("lif", "step", {}),
    "alif-ramp": ("alif", "ramp", {}),
    "izhikevich-noise": ("izhikevich", "noise", {"a": 0.5, "b": 0.2}),
    "lif-fi": ("lif", "fi", {}),
    "izhikevich-fi": ("izhikevich", "fi", {}),
}


def tool_plot(name: str) -> bytes:
    """PNG of TOOL_PLOTS[name], drawn by autocuda.plot as `autocuda plot` draws it."""
    import matplotlib

    matplotlib.use("Agg")
    from autocuda.tools import plot

    spec, what, params = TOOL_PLOTS[name]
    figure = plot.plot_fi(spec, **params) if what == "fi" else plot.response(spec, what, **params)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    plot.pyplot().close(figure)
    return buffer.getvalue()


# -- gallery of generated source ----------------------------------------------------------------------------
# spec -> (title, note, kernel, dtype, options) per section
GALLERY: dict[str, list[tuple[str, str, str, str, dict[str, Any]]]] = {
    "lif": [
        ("FPTT, float32", "Forward through time: one thread per neuron, a loop over T.", "fptt", "float32", {}),
        ("BPTT, float32", "Backward through time: the reverse loop, spike and surrogate gradient recomputed from "
         "the saved h.", "bptt", "float32", {}),
        ("Single step, soft reset", "One step (`step_mode=\"s\"`) with the reset rule changed at call time.",
         "step-forward", "float32", {"reset": "soft"}),
        ("FPTT, float16", "float16 storage, float arithmetic.", "fptt", "float16", {}),
    ],
    "izhikevich": [
        ("FPTT, float32", "Two states: the membrane v and the recovery current w.", "fptt", "float32", {}),
        ("BPTT, float32", "The charge is quadratic in v, so backward needs v[t-1]: it reads the saved v_init and "
         "recomputes later values from h.", "bptt", "float32", {}),
    ],
    "alif": [
        ("FPTT, state sequences", "With `store_state_seq=True` every state's sequence is written.", "fptt",
         "float32", {"store_state_seq": True}),
        ("BPTT, float32", "The adaptive threshold depends on the state a, so backward reads its saved sequence.",
         "bptt", "float32", {}),
    ],
    "parametric_lif": [
        ("FPTT, bfloat16", "bfloat16 storage, float arithmetic.", "fptt", "bfloat16", {}),
        ("BPTT, detach_reset", "The learnable w gets a per-neuron gradient, from h alone: "
         "(x - (v - v_reset)) sigmoid(w) = h - v, so backward does not read x; `detach_reset=True` cuts the "
         "gradient through the reset.", "bptt", "float32", {"detach_reset": True}),
    ],
}


def gallery_page(spec_name: str) -> str:
    """Markdown: the spec's TOML file, then each listed kernel's generated source."""
    import autocuda
    from autocuda.base.resources import resource_dir

    spec = autocuda.load_spec(spec_name)
    toml = (resource_dir("neuron_specs") / f"{spec_name}.toml").read_text()
    lines = [f"# {spec.name}", "", spec.doc, "",
             f"Generated by the docs build with `autocuda.source(spec, kernel, dtype, **options)`; the same text as "
             f"`autocuda show {spec.name} --kernel KERNEL --dtype DTYPE`.", "",
             "## The spec", "",
             f"`autocuda/spec/neuron_specs/{spec_name}.toml`:", "", "```toml", toml.rstrip(), "```", ""]
    for title, note, kernel, dtype, options in GALLERY[spec_name]:
        call = ", ".join([f"{kernel!r}", f"{dtype!r}", *(f"{k}={v!r}" for k, v in options.items())])
        code = autocuda.source(spec, kernel, dtype, **options)
        lines += [f"## {title}", "", f"{note} `autocuda.source(spec, {call})`:", "", "```cuda", code.rstrip(), "```",
                  ""]
    return "\n".join(lines)


# -- spec errors ----------------------------------------------------------------------------------------------
BASE = {
    "name": '"demo"',
    "charge": '"v + (x - v) / tau"',
}
BASE_TABLES = {"params": {"tau": "2.0", "v_threshold": "1.0", "v_reset": "0.0"}, "states": {"v": '"v_reset"'}}

# (what is wrong, top-level keys changed (None deletes), tables changed (None deletes a key/table), raw TOML added)
ERROR_CASES: list[tuple[str, dict[str, str | None], dict[str, dict[str, str | None] | None], str]] = [
    ("not TOML", {}, {}, "charge = v +"),
    ("no name (a file's stem is its default name)", {"name": None}, {}, ""),
    ("misspelt key", {"charge": None, "chrage": '"v + x"'}, {}, ""),
    ("no charge", {"charge": None}, {}, ""),
    ("bad name", {"name": '"2fast"'}, {}, ""),
    ("doc not a string", {"doc": "3"}, {}, ""),
    ("unknown reset", {"reset": '"zero"'}, {}, ""),
    ("unknown comparison", {"fires_at": '"=>"'}, {}, ""),
    ("hard reset without v_reset", {}, {"params": {"v_reset": None}, "states": {"v": "0.0"}}, ""),
    ("no states", {}, {"states": None}, ""),
    ("initial value names no parameter", {}, {"states": {"v": '"v_rest"'}}, ""),
    ("reserved name", {}, {"params": {"x": "1.0"}}, ""),
    ("reserved name dt", {}, {"params": {"dt": "1.0"}}, ""),
    ("name shaped like a kernel argument", {}, {"params": {"grad_tau": "1.0"}}, ""),
    ("name that is a Python keyword", {}, {"params": {"lambda": "1.0"}}, ""),
    ("name of a function", {}, {"params": {"exp": "1.0"}}, ""),
    ("name declared twice", {}, {"states": {"tau": "0.0"}}, ""),
    ("parameter not a number", {}, {"params": {"tau": '"2"'}}, ""),
    ("parameter infinite", {}, {"params": {"tau": "inf"}}, ""),
    ("parameter table without default", {}, {"params": {"tau": "{ kind = \"scalar\" }"}}, ""),
    ("unknown key in a parameter table", {}, {"params": {"tau": "{ default = 2.0, learn = true }"}}, ""),
    ("unknown kind", {}, {"params": {"tau": "{ default = 2.0, kind = \"array\" }"}}, ""),
    ("learnable scalar", {}, {"params": {"tau": "{ default = 2.0, kind = \"scalar\", learnable = true }"}}, ""),
    ("learnable not a boolean", {}, {"params": {"tau": "{ default = 2.0, learnable = 1 }"}}, ""),
    ("update of the membrane", {}, {"updates": {"v": '"0.0"'}}, ""),
    ("update of an unknown state", {}, {"updates": {"w": '"0.0"'}}, ""),
    ("state without update", {}, {"states": {"w": "0.0"}}, ""),
    ("update not a string", {}, {"states": {"w": "0.0"}, "updates": {"w": "1.0"}}, ""),
    ("option not a boolean", {}, {"options": {"fast": "1"}}, ""),
    ("params not a table", {}, {}, "params = 3"),
    ("unknown name", {"charge": '"v + x / tau_m"'}, {}, ""),
    ("unknown function", {"charge": '"v + relu(x)"'}, {}, ""),
    ("function not called", {"charge": '"v + exp"'}, {}, ""),
    ("wrong number of arguments", {"charge": '"v + exp(x, 2)"'}, {}, ""),
    ("keyword argument", {"charge": '"v + max(x, 0, key=1)"'}, {}, ""),
    ("attribute access", {"charge": '"v + x.real"'}, {}, ""),
    ("subscript", {"charge": '"v + x[0]"'}, {}, ""),
    ("lambda", {"charge": '"v + (lambda: x)"'}, {}, ""),
    ("comparison outside where()", {"charge": '"v + (x > 0)"'}, {}, ""),
    ("where() without a comparison", {"charge": '"where(x, v, 0)"'}, {}, ""),
    ("chained comparison", {"charge": '"where(0 < x < 1, v, 0)"'}, {}, ""),
    ("equality comparison", {"charge": '"where(x == 0, v, 0)"'}, {}, ""),
    ("operator outside the whitelist", {"charge": '"v + x % 2"'}, {}, ""),
    ("boolean operator", {"charge": '"v + (x and v)"'}, {}, ""),
    ("string constant", {"charge": '"v + \'a\'"'}, {}, ""),
    ("syntax error", {"charge": '"v + (x"'}, {}, ""),
    ("empty expression", {"charge": '"  "'}, {}, ""),
    ("non-ASCII character", {"charge": '"v + x / \u03c4"'}, {}, ""),
    ("division by zero", {"charge": '"v + x / 0"'}, {}, ""),
    ("complex constant", {"charge": '"v + sqrt(-1)"'}, {}, ""),
    ("literal too large", {"charge": '"v + 1e31 * x"'}, {}, ""),
    ("h or s in charge", {"charge": '"v + x - s"'}, {}, ""),
    ("option used as a value", {"charge": '"v + fast"'}, {"options": {"fast": "true"}}, ""),
    ("A if B else C without an option", {"charge": '"v + x if tau else v"'}, {}, ""),
    ("unknown surrogate", {}, {"surrogate": {"name": '"Triangle"'}}, ""),
    ("unknown surrogate parameter", {}, {"surrogate": {"name": '"ATan"', "beta": "1.0"}}, ""),
    ("surrogate parameter out of its domain", {}, {"surrogate": {"name": '"Sigmoid"', "alpha": "-1.0"}}, ""),
    ("QPseudoSpike alpha <= 1", {}, {"surrogate": {"name": '"QPseudoSpike"', "alpha": "1.0"}}, ""),
    ("surrogate table without name or gradient", {}, {"surrogate": {"alpha": "2.0"}}, ""),
    ("custom gradient with a bad name", {}, {"surrogate": {"gradient": '"1 / (1 + abs(z))"'}}, ""),
    ("custom gradient with parameter x", {}, {"surrogate": {"gradient": '"1 / (1 + abs(x))"', "x": "1.0"}}, ""),
]


def _render_toml(top: dict[str, str | None], tables: dict[str, dict[str, str | None] | None], raw: str) -> str:
    keys = {k: v for k, v in {**BASE, **top}.items() if v is not None}
    merged: dict[str, dict[str, str]] = {k: dict(v) for k, v in BASE_TABLES.items()}
    for table, entries in tables.items():
        if entries is None:
            merged.pop(table, None)
            continue
        target = merged.setdefault(table, {})
        for key, value in entries.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    if raw.startswith("params ="):
        merged.pop("params")
    lines = [f"{k} = {v}" for k, v in keys.items()] + ([raw] if raw else [])
    for table, entries in merged.items():
        lines += ["", f"[{table}]", *(f"{k} = {v}" for k, v in entries.items())]
    return "\n".join(lines) + "\n"


def _changed_lines(top: dict[str, str | None], tables: dict[str, dict[str, str | None] | None], raw: str
                   ) -> str:
    """The lines that differ from the base spec (a deletion as "(no KEY)")."""
    if "chrage" in top:  # a rename reads better as the misspelt line alone
        return f"chrage = {top['chrage']}"
    shown = [f"(no {k})" if v is None else f"{k} = {v}" for k, v in top.items()]
    for table, entries in tables.items():
        if entries is None:
            shown.append(f"(no [{table}])")
            continue
        shown += [f"[{table}] (no {k})" if v is None else f"[{table}] {k} = {v}" for k, v in entries.items()]
    return "; ".join(shown + ([raw] if raw else []))


def spec_error_rows() -> Iterator[tuple[str, str, str]]:
    """(what is wrong, the offending TOML, the message), one per ERROR_CASES entry. A case that no longer
    raises SpecError is reported with the message 'NOT REFUSED' (the hook turns that into a build warning)."""
    from autocuda import SpecError, spec_from_toml

    for what, top, tables, raw in ERROR_CASES:
        text = _render_toml(top, tables, raw)
        try:
            spec_from_toml(text, source="demo.toml")
        except SpecError as error:
            message = str(error)
        else:
            message = "NOT REFUSED"
        yield what, _changed_lines(top, tables, raw), message


def spec_error_table() -> str:
    rows = ["| mistake | change to the base spec | `SpecError` message |", "| --- | --- | --- |"]
    for what, shown, message in spec_error_rows():
        if message == "NOT REFUSED":
            log.warning("docs: the spec mistake %r is no longer refused; update ERROR_CASES in docs/hooks.py", what)
        rows.append(f"| {what} | {_cell(shown)} | {_cell(message)} |")
    base = _render_toml({}, {}, "")
    return "\n".join(["The base spec each row changes:", "", "```toml", base.rstrip(), "```", "", *rows])


def _cell(text: str) -> str:
    """Text inside a Markdown table cell: code span with pipes escaped, backticks avoided."""
    text = text.replace("|", "\\|").replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# -- shipped specs --------------------------------------------------------------------------------------------
def shipped_specs_table() -> str:
    from autocuda import list_specs

    rows = ["| spec | description |", "| --- | --- |"]
    rows += [f"| `{name}` | {doc.replace('|', '/')} |" for name, doc in list_specs()]
    return "\n".join(rows)


# -- benchmark results ----------------------------------------------------------------------------------------
def newest_results(root: Path = ROOT / "bench" / "results") -> Path | None:
    """The newest run's results.json that holds kernel speed rows (a run of other parts only, such as
    `--parts sj-classes`, has none to show here)."""
    found = sorted(root.glob("*/results.json")) if root.is_dir() else []
    return next((path for path in reversed(found) if json.loads(path.read_text()).get("speed")), None)


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def bench_markdown(path: Path | None, plot_uri: str | None = None) -> str:
    """The results table of one run (or, without results, where they will appear); the plot as an image at
    `plot_uri`, else named by its path in the repository."""
    if path is None:
        return ("No results are committed yet. After a run on a GPU, `bench/results/<date>-<gpu>/` holds "
                "`results.json`, `table.txt` and `plot.png`, and this page shows the newest run's table.")
    results = json.loads(path.read_text())
    env = results.get("environment", {})
    lines = [f"Newest run: `bench/results/{path.parent.name}` — {env.get('gpu', env.get('device', '?'))}, "
             f"torch {env.get('torch', '?')}, autocuda {env.get('autocuda', '?')} ({env.get('autocuda_commit')}), "
             f"SpikingJelly {env.get('spikingjelly', '?')}; copy bandwidth "
             f"{_fmt(results.get('copy_bandwidth_GBps'), '.0f')} GB/s.", ""]
    columns = [("workload", "workload", "s"), ("dtype", "dtype", "s"), ("mode", "mode", "s"), ("T", "T", "d"),
               ("N", "N", "d"), ("ours ms", "ours_ms", ".3f"), ("% of floor", "pct_floor", ".0f"),
               ("SJ ms", "sj_ms", ".3f"), ("× SJ", "x_sj", ".2f"), ("compile ms", "compile_ms", ".3f"),
               ("× compile", "x_compile", ".2f"), ("check", "check", "s")]
    rows = results.get("speed") or []
    if rows:
        lines += ["| " + " | ".join(c[0] for c in columns) + " |", "|" + " --- |" * len(columns)]
        lines += ["| " + " | ".join(_fmt(r.get(key), spec) for _, key, spec in columns) + " |" for r in rows]
    else:
        lines.append("This run has no speed table.")
    if plot_uri:
        lines += ["", f"![speed-ups and % of the copy-bandwidth floor]({plot_uri})"]
    elif (path.parent / "plot.png").is_file():
        lines += ["", f"The plot of speed-ups and % of the copy-bandwidth floor: "
                      f"`bench/results/{path.parent.name}/plot.png`."]
    return "\n".join(lines)


# -- generated sections of the committed pages --------------------------------------------------------------
SECTIONS = {"spec-errors": spec_error_table, "shipped-specs": shipped_specs_table,
            "bench-results": lambda: bench_markdown(newest_results())}
SECTION = re.compile(r"(<!-- autocuda:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(?=<!-- autocuda:end -->)", re.S)
DOCS = ROOT / "docs"


def generated(markdown: str, made: dict[str, str] | None = None) -> str:
    """`markdown` with each marked section's body made afresh (`made`: bodies already made, by name)."""
    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in SECTIONS:
            raise KeyError(f"unknown generated section {name!r} (known: {', '.join(SECTIONS)})")
        body = made[name] if made and name in made else SECTIONS[name]()
        return f"{match[1]}{body.rstrip()}\n"
    return SECTION.sub(fill, markdown)


def stale_pages(docs: Path = DOCS) -> dict[Path, str]:
    """The pages whose generated sections are not what the code makes now, each with what it should hold."""
    made = {name: make() for name, make in SECTIONS.items()}
    pages = ((page, page.read_text()) for page in sorted(docs.rglob("*.md")))
    fresh = {page: (text, generated(text, made)) for page, text in pages if "<!-- autocuda:" in text}
    return {page: new for page, (old, new) in fresh.items() if new != old}


# -- MkDocs events --------------------------------------------------------------------------------------------
OPTIONAL_PAGES = [("Spec format", "Neurons as differential equations", "ode.md")]  # (after, title, page)


def _nav_pages(nav: Any) -> Iterator[str]:
    for item in nav or []:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


def _insert_after(nav: list, after: str, entry: dict) -> bool:
    """Put `entry` after the item titled `after`, wherever it is in the (nested) navigation."""
    for i, item in enumerate(nav):
        if isinstance(item, dict):
            title, value = next(iter(item.items()))
            if title == after:
                nav.insert(i + 1, entry)
                return True
            if isinstance(value, list) and _insert_after(value, after, entry):
                return True
    return False


def on_config(config):
    """Pages other people write (docs/ode.md) join the navigation when they exist."""
    _use_checkout()
    nav = config.nav
    for after, title, page in OPTIONAL_PAGES:
        if nav is None or not (Path(config.docs_dir) / page).is_file() or page in set(_nav_pages(nav)):
            continue
        if not _insert_after(nav, after, {title: page}):
            nav.append({title: page})
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for name in surrogate_names():
        files.append(File.generated(config, f"img/surrogates/{name}.png", content=surrogate_plot(name)))
    for spec_name in GALLERY:
        files.append(File.generated(config, f"gallery/{spec_name}.md", content=gallery_page(spec_name)))
    for name in TOOL_PLOTS:
        files.append(File.generated(config, f"img/plots/{name}.png", content=tool_plot(name)))
    results = newest_results()
    if results is not None and (results.parent / "plot.png").is_file():
        files.append(File.generated(config, "img/bench/plot.png", abs_src_path=str(results.parent / "plot.png")))
    return files


def _bench_plot(page) -> str | None:
    """The bench plot's address from `page` on the site, where the newest results have one."""
    results = newest_results()
    if results is None or not (results.parent / "plot.png").is_file():
        return None
    return "../" * page.file.src_uri.count("/") + "img/bench/plot.png"


def on_page_markdown(markdown, page, config, files):
    """The committed sections as they are (tests/test_docs.py keeps them current), with the bench plot added."""
    plot = _bench_plot(page) if "<!-- autocuda:bench-results -->" in markdown else None
    if plot is None:
        return markdown
    return generated(markdown, {"bench-results": bench_markdown(newest_results(), plot)})


if __name__ == "__main__":  # python docs/hooks.py: rewrite the stale generated sections of docs/*.md
    for stale_page, fresh_text in stale_pages().items():
        stale_page.write_text(fresh_text)
        print(f"rewrote {stale_page.relative_to(ROOT)}")
