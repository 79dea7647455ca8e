"""Jinja2 environment for the kernel skeletons in codegen/templates/ (StrictUndefined: a missing value is an
error)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..base.resources import resource_dir
from .dtypes import NAN_FOLDS

if TYPE_CHECKING:
    import jinja2


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import jinja2  # rendering only: a process running cached kernels never renders

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        auto_reload=False,  # the templates are the package's own: not checked for changes at each render (a stat)
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )


def render(template: str, **context: Any) -> str:
    """The whole text of a template; a source that calls the printer's NaN-keeping min or max (`dtypes.NAN_FOLDS`)
    gets their definitions in its prelude."""
    if "prelude" in context and any(isinstance(v, str) and ("ac_minimum(" in v or "ac_maximum(" in v)
                                    for v in context.values()):
        context["prelude"] = NAN_FOLDS + context["prelude"]
    return environment().get_template(template).render(**context)


def render_block(template: str, block: str, **context: Any) -> str:
    """The text of one named block of a template (used for CKernel's head/core/tail views)."""
    tmpl = environment().get_template(template)
    ctx = tmpl.new_context(context)
    for _ in tmpl.root_render_func(ctx):  # registers the blocks a child template inherits (`declaration`)
        pass
    return "".join(ctx.blocks[block][0](ctx))
