"""What the documentation claims, checked against the code: messages it quotes, and (slow profile) its Python
blocks run on the CPU, page by page, the way a reader copies them."""
from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import profile

from autocuda import functional as F
from autocuda.nn import LIFNode, Neuron

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _message(call) -> str:
    with pytest.raises(Exception) as info:
        call()
    return f"{type(info.value).__name__}: {info.value}"


# (what the call gets wrong, the call): docs/bad-input.md quotes each message, "..." ending a quote where it
# elides the rest
BAD_INPUT = [
    ("a list", lambda: F.multi_step("lif", [[1.0]])),
    ("an integer dtype", lambda: F.multi_step("lif", torch.ones(4, 3, dtype=torch.int64))),
    ("a sparse input", lambda: F.multi_step("lif", torch.rand(4, 3).to_sparse())),
    ("a 1-D multi_step input", lambda: F.multi_step("lif", torch.rand(4))),
    ("a 0-D input in step mode 'm'", lambda: LIFNode(step_mode="m")(torch.tensor(1.0))),
    ("too many states", lambda: F.multi_step("lif", torch.rand(4, 3), torch.zeros(3), torch.zeros(3))),
    ("an ndarray state", lambda: F.multi_step("lif", torch.rand(4, 3), np.zeros(3))),
    ("a state's shape", lambda: F.multi_step("lif", torch.rand(4, 3), torch.zeros(2))),
    ("a state's dtype", lambda: F.multi_step("lif", torch.rand(4, 3), torch.zeros(3, dtype=torch.float64))),
    ("an unknown parameter", lambda: F.multi_step("lif", torch.rand(4, 3), taux=2.0)),
    ("a string parameter", lambda: F.multi_step("lif", torch.rand(4, 3), tau="2")),
    ("an integer tensor parameter",
     lambda: F.multi_step("lif", torch.rand(4, 3), tau=torch.ones(3, dtype=torch.int64))),
    ("a parameter's shape", lambda: F.multi_step("lif", torch.rand(4, 3), tau=torch.ones(4))),
    ("a number outside the domain (a call)", lambda: F.multi_step("lif", torch.rand(4, 3), tau=-1)),
    ("a number outside the domain (a module)", lambda: Neuron("lif", tau=-1)),
    ("an unknown spec", lambda: F.multi_step("nope", torch.rand(4, 3))),
    ("an unknown surrogate", lambda: F.multi_step("lif", torch.rand(4, 3), surrogate="foo")),
    ("a backend", lambda: F.multi_step("lif", torch.rand(4, 3), backend="gpu")),
    ("a step mode", lambda: LIFNode(step_mode="x")),
    ("save_h", lambda: F.multi_step("lif", torch.rand(4, 3), save_h=0)),
]


@pytest.mark.parametrize("call", [c for _, c in BAD_INPUT], ids=[w for w, _ in BAD_INPUT])
def test_bad_input_page_quotes_the_messages(call) -> None:
    page = (DOCS / "bad-input.md").read_text()
    message = _message(call)
    quotes = {q.split("...")[0].rstrip() for q in re.findall(r"`([^`]*)`", page) if len(q) >= 20}
    assert any(message.startswith(q) or message.split(": ", 1)[1].startswith(q) for q in quotes), message


def test_modules_name_the_spec_of_a_number_outside_its_domain_as_calls_do() -> None:
    # docs/bad-input.md: the functional API and the modules, at construction and at each call, say
    # "parameter 'tau' of 'lif' must be > 0, got -1"
    for call in (lambda: Neuron("lif", tau=-1.0), lambda: F.multi_step("lif", torch.rand(2, 3), tau=-1.0)):
        with pytest.raises(ValueError, match=r"^parameter 'tau' of 'lif' must be > 0, got -1$"):
            call()


def test_batchnorm_fusions_reports_the_fusions_before_fuse_batchnorm() -> None:
    # docs/batchnorm.md lists "what would be fused" with batchnorm_fusions before fuse_batchnorm rewrites the model
    pytest.importorskip("spikingjelly")
    from spikingjelly.activation_based import layer

    from autocuda.nn import batchnorm_fusions, fuse_batchnorm

    model = torch.nn.Sequential(layer.BatchNorm2d(4, step_mode="m"), LIFNode(step_mode="m"))
    assert [f.fused for f in batchnorm_fusions(model)] == [True]
    fuse_batchnorm(model)
    assert batchnorm_fusions(model) == []


# -- the docs' Python blocks, run (slow profile) ---------------------------------------------------------------------
# Blocks that cannot run here, by a line they hold: CuPy, a torchrun process with NCCL, fragments of a reader's own
# program (`model`, `loader`). Blocks that use CUDA run with the CPU in its place.
NOT_HERE = ("import cupy", 'os.environ["LOCAL_RANK"]', "model = model.to(memory_format", "progress(loader",
            "channels,), 2.0)")
# What a page's reader has made before its blocks: the files the prose says to save, a model to fuse
BEFORE = {
    "tutorial.md": "adaptive_lif.toml",
    "ode.md": "coba_lif.toml",
}


def _page_blocks(page: Path) -> list[tuple[int, str, str]]:
    text = page.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


@pytest.mark.skipif(profile() != "slow", reason="runs every Python block of the docs (about 5 s); --slow runs it")
@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in DOCS.glob("*.md"))])
def test_docs_python_blocks_run_on_the_cpu(page: str, tmp_path: Path, monkeypatch) -> None:
    path = ROOT / page if page == "README.md" else DOCS / page
    blocks = _page_blocks(path)
    monkeypatch.chdir(tmp_path)
    if page in BEFORE:  # the page's first TOML block, saved under the name the prose gives it
        (tmp_path / BEFORE[page]).write_text(next(code for _, language, code in blocks if language == "toml"))
    try:  # SpikingJelly's monitor module imports tensorboard
        importlib.import_module("torch.utils.tensorboard")
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = object  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", stub)
    namespace: dict = {"__name__": "__docs__"}
    if page == "batchnorm.md":
        namespace["model"] = torch.nn.Sequential(torch.nn.Linear(4, 4), LIFNode(step_mode="m"))
    for line, language, code in blocks:
        if language != "python" or any(marker in code for marker in NOT_HERE):
            continue
        code = code.replace('device="cuda"', 'device="cpu"').replace(".cuda()", "")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102
