"""Terminal tables that keep one line per record at any width (``rich``).

rich shrinks a too-wide table by squeezing *every* column in proportion, so at
80 columns an id or a rank can vanish while a long free-text cell keeps its
room. :func:`one_line_table` budgets the width instead: key columns keep their
natural width (they never wrap), and the free-text columns (``flex``) share
what is left, ending in "…" when they do not fit. Callers leave secondary
columns out below a width of their choosing (see the ``wide`` checks of
``stormwatch alerts incidents``, ``chaos ledger`` and ``lab status``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text


@dataclass(frozen=True, kw_only=True)
class Col:
    """One column of :func:`one_line_table`.

    Attributes:
        header: the column's title.
        flex: free text that may be cut short (ends in "…") to keep the row on one line.
        min_width: the narrowest a ``flex`` column gets, in cells (when the width allows).
    """

    header: str
    flex: bool = False
    min_width: int = 8


#: Cells a rich table with the default box spends per column (border + one space each
#: side), plus one for the closing border.
_PER_COLUMN = 3


def _cell_width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.splitlines()), default=0)


def _shares(natural: list[int], floors: list[int], room: int) -> list[int]:
    """Widths for the flex columns: each its natural width when all fit, else a fair
    share of ``room`` (narrow columns keep theirs, the rest split what is left)."""
    widths = [0] * len(natural)
    left = room
    order = sorted(range(len(natural)), key=lambda i: natural[i])
    for done, i in enumerate(order):
        fair = left // (len(order) - done)
        widths[i] = max(min(natural[i], fair), min(floors[i], natural[i]))
        left -= widths[i]
    return widths


def short_age(seconds: float) -> str:
    """An age that fits a narrow column: ``42s``, ``17m``, ``3h05m``, ``2d04h`` (negative: ``0s``)."""
    s = max(0, int(seconds))
    if s < 3600:
        return f"{s}s" if s < 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def one_line_table(
    columns: Sequence[Col], rows: Sequence[Sequence[str]], *, width: int, title: str | None = None
) -> Table:
    """A rich table of ``rows`` (cells in rich markup) that is at most ``width`` cells wide
    while its key columns fit, with one line per row (line breaks in cells become ``; ``).

    Raises:
        ValueError: a row has another number of cells than there are columns.
    """
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"row of {len(row)} cells for {len(columns)} columns: {row!r}")
    flat = [[cell.replace("\n", "; ") for cell in row] for row in rows]
    natural = [
        max([len(col.header), *(_cell_width(row[i]) for row in flat)])
        for i, col in enumerate(columns)
    ]
    fixed = sum(w for w, col in zip(natural, columns, strict=True) if not col.flex)
    room = width - _PER_COLUMN * len(columns) - 1 - fixed
    flex = [i for i, col in enumerate(columns) if col.flex]
    shares = _shares(
        [natural[i] for i in flex], [max(columns[i].min_width, 1) for i in flex], max(room, 0)
    )
    limit = dict(zip(flex, shares, strict=True))
    table = Table(title=title)
    for i, col in enumerate(columns):
        if col.flex:
            table.add_column(
                col.header, no_wrap=True, overflow="ellipsis", max_width=max(limit[i], 1)
            )
        else:
            table.add_column(col.header, no_wrap=True, min_width=natural[i])
    for row in flat:
        table.add_row(*row)
    return table


__all__ = ["Col", "one_line_table", "short_age"]
