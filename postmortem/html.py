"""Render a :class:`~.document.Document` as one self-contained HTML page (``postmortem.html``).

The page has no script and no external reference: its figures are inlined as
``data:image/png;base64`` URIs and its style sheet is inline, so it opens offline and
can be attached to a ticket as one file. Every text is HTML-escaped; ``**strong**``
and ```code``` become ``<strong>`` and ``<code>``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from stormwatch.postmortem.document import (
    Block,
    Bullets,
    Document,
    Figure,
    KeyValues,
    Paragraph,
    Table,
)
from stormwatch.postmortem.plots import png_data_uri

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.summary { background: #fff8e5; border-left: 4px solid #e0a800; padding: 0.6em 1em; }
small { color: #666; }
"""
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _text(text: str) -> str:
    """Escaped text with the two inline marks turned into tags."""
    escaped = html.escape(text)
    return _CODE.sub(r"<code>\1</code>", _STRONG.sub(r"<strong>\1</strong>", escaped))


def _block(block: Block, folder: Path) -> str:
    e = html.escape
    if isinstance(block, Paragraph):
        return (
            f'<p class="summary">{_text(block.text)}</p>'
            if block.lead
            else f"<p>{_text(block.text)}</p>"
        )
    if isinstance(block, Bullets):
        return "\n".join(["<ul>", *(f"<li>{_text(i)}</li>" for i in block.items), "</ul>"])
    if isinstance(block, Table):
        head = "".join(f"<th>{_text(c)}</th>" for c in block.columns)
        rows = "".join(
            "<tr>" + "".join(f"<td>{_text(c)}</td>" for c in row) + "</tr>\n" for row in block.rows
        )
        return f"<table><tr>{head}</tr>\n{rows}</table>"
    if isinstance(block, KeyValues):
        rows = "".join(f"<tr><th>{_text(k)}</th><td>{_text(v)}</td></tr>\n" for k, v in block.rows)
        return f"<table>\n{rows}</table>"
    if isinstance(block, Figure):
        uri = png_data_uri(folder / block.file)
        plot = f' data-plot="{e(block.name)}"' if block.name else ""
        return (
            f'<figure><img src="{uri}" alt="{e(block.title)}"{plot}>'
            f"<figcaption><small>{e(block.caption)}</small></figcaption></figure>"
        )
    raise TypeError(f"not a block: {block!r}")


def render_html(document: Document, folder: Path) -> str:
    """The document as one HTML page; figures are read from ``folder`` and inlined."""
    title = html.escape(document.title)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
    ]
    parts += [_block(b, folder) for b in document.lead]
    for section in document.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts += [_block(b, folder) for b in section.blocks]
    if document.footer:
        parts.append(f"<p><small>{html.escape(document.footer)}</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["render_html"]
