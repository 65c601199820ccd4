"""Start-up check of the trainer's output folders: creatable and writable, or a clear ConfigError.

Every folder option (``--checkpoint-dir``, ``--log-dir``, ``--metrics-dir``,
``--control-dir``, ``--dump-dir``, ``--spans-dir``) is checked by
:func:`check_writable_dirs` before ``torch`` is imported and before the
process group exists, so a folder that cannot be written fails the run in
milliseconds with one message instead of at the first save, after training.
Each rank checks (a node may mount a folder differently), with a probe file
named after its process id so that ranks of one node never collide.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stormwatch.trainer.errors import UnwritableDirError

#: Prefix of the probe file written and removed in each folder (hidden, so no
#: scanner of ``rank<R>.jsonl``, ``*.db`` or ``step-*`` ever sees it).
PROBE_PREFIX = ".stormwatch-probe-"


@dataclass(frozen=True)
class DirOption:
    """One folder to check.

    Attributes:
        option: how the user names it (``--log-dir``), used in the message.
        path: the folder; ``None`` (option off) is skipped.
        default_from: when the folder was derived from another option, how
            (``"<log-dir>/dumps"``), so the message explains where it came from.
    """

    option: str
    path: Path | None
    default_from: str | None = None


def check_writable_dir(option: DirOption) -> None:
    """Create ``option.path`` (with parents) and write then remove a probe file in it.

    Raises:
        UnwritableDirError: the folder cannot be created, is not a folder, or
            a file cannot be written in it; the message names the option,
            the folder, the operating system's reason and the fix.
    """
    path = option.path
    if path is None:
        return
    probe = path / f"{PROBE_PREFIX}{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename not in (None, str(path)) else ""
        source = f" [default: {option.default_from}]" if option.default_from else ""
        raise UnwritableDirError(
            f"{option.option}{source}: cannot create or write the folder {path}: "
            f"{reason}{where}; pass a folder this user can create and write "
            f"(it is created if missing)",
            option=option.option,
            path=path,
        ) from None


def check_writable_dirs(options: Iterable[DirOption]) -> None:
    """:func:`check_writable_dir` for each folder, in order; the first failure raises.

    Raises:
        UnwritableDirError: see :func:`check_writable_dir`.
    """
    for option in options:
        check_writable_dir(option)


__all__ = [
    "PROBE_PREFIX",
    "DirOption",
    "UnwritableDirError",
    "check_writable_dir",
    "check_writable_dirs",
]
