"""The documentation's code parses and its generated parts are produced (CI builds the site with
`mkdocs build --strict`; this test needs neither MkDocs nor matplotlib)."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

import autocuda
from autocuda.spec.surrogate import SURROGATES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[tuple[str, str]]:
    return [(f"{page.relative_to(DOCS)}:{text[:m.start()].count(chr(10)) + 1}", m.group(2))
            for page in PAGES for text in [page.read_text()] for m in BLOCK.finditer(text) if m.group(1) == language]


def load_hooks():
    spec = importlib.util.spec_from_file_location("autocuda_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks():
    return load_hooks()


def test_docs_have_code() -> None:
    assert len(blocks("python")) >= 10 and len(blocks("toml")) >= 3


@pytest.mark.parametrize(("where", "code"), blocks("python"), ids=[w for w, _ in blocks("python")])
def test_python_blocks_parse(where: str, code: str) -> None:
    ast.parse(code, filename=where)


@pytest.mark.parametrize(("where", "text"), blocks("toml"), ids=[w for w, _ in blocks("toml")])
def test_toml_blocks_load_as_specs(where: str, text: str) -> None:
    spec = autocuda.spec_from_toml(text, source=where, default_name="doc_block")
    assert spec.states


def test_every_surrogate_has_a_gallery_entry_and_a_plot(hooks) -> None:
    page = (DOCS / "surrogates.md").read_text()
    for name in SURROGATES:
        assert f"\n## {name}\n" in page, name
    assert set(hooks.surrogate_names()) == set(SURROGATES) - {"Custom"}
    for name in hooks.surrogate_names():
        assert f"(img/surrogates/{name}.png)" in page, name


def test_one_surrogate_plot_renders(hooks) -> None:
    pytest.importorskip("matplotlib")
    assert hooks.surrogate_plot("PiecewiseLeakyReLU").startswith(b"\x89PNG")


def test_every_documented_spec_mistake_is_refused(hooks) -> None:
    rows = list(hooks.spec_error_rows())
    assert len(rows) == len(hooks.ERROR_CASES)
    refused = [message for _, _, message in rows if message != "NOT REFUSED"]
    assert refused == [message for _, _, message in rows], [what for what, _, m in rows if m == "NOT REFUSED"]
    assert all(message.startswith("demo.toml") for message in refused)


def test_gallery_pages_render(hooks) -> None:
    page = hooks.gallery_page("lif")
    assert "```cuda" in page and "__global__" in page and "```toml" in page


def test_navigation_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        name = page.relative_to(DOCS).as_posix()
        assert name in nav, f"{name} is not in mkdocs.yml's nav"
    for name in re.findall(r"gallery/(\w+)\.md", nav):
        assert name in load_hooks().GALLERY


def test_bench_table_without_results(hooks, tmp_path: Path) -> None:
    assert hooks.newest_results(tmp_path) is None
    assert "No results" in hooks.bench_markdown(None)


def test_bench_table_from_results(hooks, tmp_path: Path) -> None:
    run = tmp_path / "2030-01-01-gpu"
    run.mkdir()
    row = {"workload": "lif", "dtype": "float32", "mode": "training", "T": 8, "N": 1 << 20, "ours_ms": 0.5,
           "pct_floor": 80.0, "sj_ms": 1.0, "x_sj": 2.0, "compile_ms": None, "x_compile": None, "check": "ok"}
    (run / "results.json").write_text(json.dumps({"environment": {"gpu": "Some GPU", "torch": "2.13"},
                                                  "copy_bandwidth_GBps": 3000.0, "speed": [row]}))
    assert hooks.newest_results(tmp_path) == run / "results.json"
    later = tmp_path / "2030-01-02-gpu"  # a newer run of other parts only (no kernel speed rows): not shown
    later.mkdir()
    (later / "results.json").write_text(json.dumps({"environment": {"gpu": "Some GPU"}, "sj_classes": [{}]}))
    assert hooks.newest_results(tmp_path) == run / "results.json"
    text = hooks.bench_markdown(run / "results.json", "img/bench/plot.png")
    assert "| lif | float32 | training | 8 | 1048576 | 0.500 | 80 | 1.000 | 2.00 | – | – | ok |" in text
    assert "Some GPU" in text and "plot.png" in text


def test_generated_sections_of_the_pages_are_current(hooks) -> None:
    """The committed pages hold what the code makes (so they read whole on GitHub); after a change to the code,
    `python docs/hooks.py` rewrites them."""
    stale = hooks.stale_pages()
    assert not stale, f"run `python docs/hooks.py` to rewrite {sorted(p.name for p in stale)}"
    for page in PAGES:
        text = page.read_text()
        starts = re.findall(r"<!-- autocuda:([\w-]+) -->", text)
        assert starts.count("end") == len(starts) - starts.count("end"), f"{page.name}: a section without its end"
        assert set(starts) - {"end"} <= set(hooks.SECTIONS), page.name
        for match in hooks.SECTION.finditer(text):
            assert match["body"].strip(), f"{page.name}: section {match['name']} is empty"


def test_sections_are_rewritten_in_place(hooks) -> None:
    page = "intro\n<!-- autocuda:shipped-specs -->\nold table\n<!-- autocuda:end -->\nafter\n"
    fresh = hooks.generated(page, {"shipped-specs": "| new |\n"})
    assert fresh == "intro\n<!-- autocuda:shipped-specs -->\n| new |\n<!-- autocuda:end -->\nafter\n"
    assert hooks.generated(fresh, {"shipped-specs": "| new |"}) == fresh
    with pytest.raises(KeyError, match="unknown generated section 'nope'"):
        hooks.generated("<!-- autocuda:nope -->\n<!-- autocuda:end -->\n")


def readme_blocks(language: str) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer((ROOT / "README.md").read_text()) if m.group(1) == language]


def test_readme_builder_example_runs_here() -> None:
    """The README's builder example, as a reader pastes it: on the GPU where there is one, else on the host
    runner (the same source compiled for the CPU)."""
    from autocuda.toolchain.host import cxx as toolchain

    if toolchain.missing() and not torch.cuda.is_available():
        pytest.skip(f"host runner: {toolchain.missing()}")
    (example,) = readme_blocks("python")
    exec(compile(example, "README.md", "exec"), {})  # noqa: S102 - our own README
