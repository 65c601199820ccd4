"""The training corpus: the running interpreter's standard-library source, as bytes.

Why this corpus: it is present on every machine that can run the trainer
(no download, no data set to ship), it is real text with structure a tiny
model can learn (loss falls visibly within a few dozen steps), and it is
identical on every rank of a job as long as the ranks run the same
interpreter, which the lab guarantees (one shared virtual environment).

What exactly:

* folder: ``sysconfig.get_paths()["stdlib"]`` of the running interpreter;
* files: the ``*.py`` regular files directly in that folder (no sub-folders,
  so packages such as ``asyncio/`` are not read), sorted by file name
  (Unicode code point order, i.e. ``sorted()`` of the names);
* joined with :data:`SEPARATOR` (``b"\\n\\x1c\\n"``: ASCII "file separator"
  0x1C between newlines, a byte that does not occur in Python source);
* cut at ``max_bytes`` (default 1 MiB,
  :data:`stormwatch.trainer.config.DEFAULT_CORPUS_MAX_BYTES`).

A different Python version gives a different corpus; :class:`Corpus` carries
a SHA-256 fingerprint so that a checkpoint is never resumed on other data.
No torch import here.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from stormwatch.trainer.config import DEFAULT_CORPUS_MAX_BYTES
from stormwatch.trainer.errors import CorpusError

#: Bytes placed between two files.
SEPARATOR = b"\n\x1c\n"


@dataclass(frozen=True)
class Corpus:
    """Corpus bytes plus where they came from.

    Attributes:
        data: the concatenated, capped bytes.
        files: names of the files that contributed (the last one possibly cut).
        source_dir: folder the files were read from.
        sha256: hex SHA-256 of ``data``.
    """

    data: bytes
    files: tuple[str, ...]
    source_dir: Path
    sha256: str

    def __len__(self) -> int:
        return len(self.data)


def stdlib_dir() -> Path:
    """Folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_stdlib_corpus(
    max_bytes: int = DEFAULT_CORPUS_MAX_BYTES, *, source_dir: Path | None = None
) -> Corpus:
    """Read the corpus described in the module docstring.

    Args:
        max_bytes: cap on the result's length, in bytes (> 0).
        source_dir: folder to read instead of the interpreter's stdlib (tests).

    Returns:
        The :class:`Corpus`; ``len(corpus) <= max_bytes``.

    Raises:
        CorpusError: the folder cannot be read or holds no ``*.py`` file.
    """
    if max_bytes <= 0:
        raise CorpusError(f"max_bytes must be > 0 (got {max_bytes})")
    folder = source_dir if source_dir is not None else stdlib_dir()
    try:
        paths = sorted((p for p in folder.glob("*.py") if p.is_file()), key=lambda p: p.name)
    except OSError as exc:
        raise CorpusError(f"cannot list {folder}: {exc}") from exc
    if not paths:
        raise CorpusError(f"no *.py files directly in {folder}")
    chunks: list[bytes] = []
    used: list[str] = []
    size = 0
    for path in paths:
        if size >= max_bytes:
            break
        try:
            chunk = path.read_bytes()
        except OSError as exc:
            raise CorpusError(f"cannot read {path}: {exc}") from exc
        if chunks:
            chunks.append(SEPARATOR)
            size += len(SEPARATOR)
        chunks.append(chunk)
        size += len(chunk)
        used.append(path.name)
    data = b"".join(chunks)[:max_bytes]
    return Corpus(
        data=data,
        files=tuple(used),
        source_dir=folder,
        sha256=hashlib.sha256(data).hexdigest(),
    )


__all__ = ["SEPARATOR", "Corpus", "load_stdlib_corpus", "stdlib_dir"]
