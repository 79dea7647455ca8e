"""The one way generated kernel bodies are written: a builder of C lines that owns indentation and braces.

`Code.block` writes an opening brace, the lines added inside it, and the closing brace, so a brace can never be
opened in one place and closed in another; nothing outside the builder indents a line.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

INDENT = "    "


class Code:
    """Lines of C text at a current depth of indentation."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        """One line at the current depth; without text, a line of the indentation alone."""
        self.lines.append(INDENT * self.depth + text)

    def blank(self) -> None:
        """An empty line (no indentation)."""
        self.lines.append("")

    @contextmanager
    def block(self, head: str = "", note: str = "", indent: bool = True) -> Iterator[Code]:
        """`head {note`, the lines added inside (one level deeper, unless `indent` is False: a guard wrapping a
        whole step keeps the step's own depth), then `}` at the depth of the opening line."""
        self.line((head + " {" if head else "{") + note)
        self.depth += int(indent)
        yield self
        self.depth -= int(indent)
        self.line("}")

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def braced(text: str) -> str:
    """`{text}`: a brace initialiser on one line."""
    return "{" + text + "}"
