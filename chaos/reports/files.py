"""A report's two files, ``<stem>.json`` (the model) and ``<stem>.md`` (its rendering):
written atomically, read back with each problem named by its path. One home for the
game day's scorecard (:mod:`stormwatch.chaos.gameday.scorecard`) and the soak's report
(:mod:`stormwatch.chaos.soak.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from stormwatch.chaos.errors import ChaosError

M = TypeVar("M", bound=BaseModel)


def write_report_files(
    folder: Path, stem: str, model: BaseModel, markdown: str
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` (``model``) and ``<stem>.md`` (``markdown``) into ``folder``
    (made if missing), each through a temporary file renamed over it: a reader sees the
    old file or the new one, never half of one. Returns (md, json).

    Raises:
        OSError: the folder or a file cannot be written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
    for path, text in ((json_path, model.model_dump_json(indent=2)), (md_path, markdown)):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return md_path, json_path


def load_report_file(path: Path, model: type[M], *, what: str, fix: str) -> M:
    """Read a ``<stem>.json`` written by :func:`write_report_files` as ``model``.

    Args:
        what: what the file is, for the messages (``the scorecard``).
        fix: what to do when it is not one (``give a RUN_DIR/suites/<id>/scorecard.json``).

    Raises:
        ChaosError: missing, unreadable, not JSON, or not a ``model`` (each problem named by
            its path in the file, e.g. ``rows.0.category``).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChaosError(f"{path}: cannot read {what}: {exc}") from exc
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'file'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ChaosError(f"{path}: not {what} ({problems}){fix}") from exc


__all__ = ["load_report_file", "write_report_files"]
