"""Render a :class:`~.document.Document` as Markdown (what ``postmortem.md`` holds).

Headings ``#`` (title) and ``##`` (sections), one blank line between blocks; table
cells and list items have ``|`` escaped and line breaks folded into spaces, so a
message with either cannot break the table or the list; figures are images linked
by file name (the PNG files lie beside the Markdown).
"""

from __future__ import annotations

from stormwatch.postmortem.document import (
    Block,
    Bullets,
    Document,
    Figure,
    KeyValues,
    Paragraph,
    Table,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(columns), "|" + "---|" * len(columns)] + [_row(r) for r in rows]


def block_lines(block: Block) -> list[str]:
    """The Markdown lines of one block."""
    if isinstance(block, Paragraph):
        return [block.text]
    if isinstance(block, Bullets):
        return [f"- {_cell(item)}" for item in block.items]
    if isinstance(block, Table):
        return _table(list(block.columns), [list(r) for r in block.rows])
    if isinstance(block, KeyValues):
        return _table(list(block.columns), [[k, v] for k, v in block.rows])
    if isinstance(block, Figure):
        return [f"![{block.caption}]({block.file})"]
    raise TypeError(f"not a block: {block!r}")


def render_markdown(document: Document) -> str:
    """The document as Markdown text (ends with one newline)."""
    lines = [f"# {document.title}", ""]
    for block in document.lead:
        lines += [*block_lines(block), ""]
    for section in document.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            lines += [*block_lines(block), ""]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


__all__ = ["block_lines", "render_markdown"]
