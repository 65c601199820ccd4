"""Write a post-mortem's files: the JSON record, the Markdown and (optionally) the HTML page.

Each file is written to a temporary name and renamed into place, so a reader (the
responder's follow-up, ``stormwatch plan``, a person with the folder open) never sees
half a report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from stormwatch.postmortem.document import Document
from stormwatch.postmortem.html import render_html
from stormwatch.postmortem.markdown import render_markdown

MARKDOWN = "postmortem.md"
JSON = "postmortem.json"
HTML = "postmortem.html"


@dataclass(frozen=True)
class ReportFiles:
    """Where one report was written (``html`` None when no page was asked for)."""

    folder: Path
    markdown: Path
    json: Path
    html: Path | None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_report(
    folder: Path, record: BaseModel, document: Document, *, html: bool = True
) -> ReportFiles:
    """Write ``postmortem.json`` (``record``, indented), ``postmortem.md`` and, with ``html``,
    ``postmortem.html`` (its figures inlined from ``folder``) into ``folder`` (created)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        folder=folder,
        markdown=folder / MARKDOWN,
        json=folder / JSON,
        html=folder / HTML if html else None,
    )
    write_atomic(files.json, record.model_dump_json(indent=2))
    write_atomic(files.markdown, render_markdown(document))
    if files.html is not None:
        write_atomic(files.html, render_html(document, folder))
    return files


__all__ = ["HTML", "JSON", "MARKDOWN", "ReportFiles", "write_atomic", "write_report"]
