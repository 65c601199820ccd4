"""A post-mortem as a document: title, lead blocks and sections of blocks, before any format.

Each report kind (:mod:`.experiment`, :mod:`.incident`) lays its facts out as a
:class:`Document`; the renderers (:mod:`.markdown`, :mod:`.html`) turn any document
into a file, so both reports are written by the same code. Text is plain, with two
inline marks both renderers understand: ``**strong**`` and ```code```.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Paragraph:
    """Running text (``lead``: the report's summary, set apart in HTML)."""

    text: str
    lead: bool = False


@dataclass(frozen=True)
class Bullets:
    """A bulleted list, one item per line."""

    items: Sequence[str]


@dataclass(frozen=True)
class Table:
    """A table with a header row (``columns``) and one row of cells per item."""

    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class KeyValues:
    """A two-column table of (measure, value) rows; in HTML the measure is the row's header."""

    rows: Sequence[tuple[str, str]]
    columns: tuple[str, str] = ("measure", "value")


@dataclass(frozen=True)
class Figure:
    """A PNG beside the report.

    Attributes:
        file: its name, relative to the report's folder.
        title: what it shows (the image's alternative text in HTML).
        caption: the line under it in HTML, and its alternative text in Markdown.
        name: a short stable id (``data-plot`` in HTML), or "".
    """

    file: str
    title: str
    caption: str
    name: str = ""


Block = Paragraph | Bullets | Table | KeyValues | Figure


@dataclass(frozen=True)
class Section:
    """A titled part of the report (a section without blocks still shows its title)."""

    title: str
    blocks: Sequence[Block] = ()


@dataclass(frozen=True)
class Document:
    """One report: ``title``, ``lead`` blocks under it, then ``sections``; ``footer`` is a
    last line of small print in HTML (a Markdown file has its date on disk)."""

    title: str
    lead: Sequence[Block] = ()
    sections: Sequence[Section] = ()
    footer: str = ""


__all__ = [
    "Block",
    "Bullets",
    "Document",
    "Figure",
    "KeyValues",
    "Paragraph",
    "Section",
    "Table",
]
