"""The corpus is the stdlib's top-level *.py files, sorted, joined and capped; batches are pure."""

from __future__ import annotations

import pytest

from stormwatch.trainer import CorpusError, load_stdlib_corpus
from stormwatch.trainer.data.corpus import SEPARATOR, stdlib_dir


def test_stdlib_corpus_is_deterministic_and_capped():
    first = load_stdlib_corpus(200_000)
    second = load_stdlib_corpus(200_000)
    assert first == second
    assert len(first) == 200_000
    assert first.files == tuple(sorted(first.files))
    assert first.source_dir == stdlib_dir()
    assert first.data.startswith((stdlib_dir() / first.files[0]).read_bytes()[:1000])


def test_corpus_reads_only_top_level_py_files_sorted_by_name(tmp_path):
    (tmp_path / "b.py").write_bytes(b"B")
    (tmp_path / "a.py").write_bytes(b"A")
    (tmp_path / "notes.txt").write_bytes(b"T")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "c.py").write_bytes(b"C")
    corpus = load_stdlib_corpus(1000, source_dir=tmp_path)
    assert corpus.data == b"A" + SEPARATOR + b"B"
    assert corpus.files == ("a.py", "b.py")


def test_corpus_cap_cuts_the_last_file(tmp_path):
    (tmp_path / "a.py").write_bytes(b"x" * 10)
    (tmp_path / "b.py").write_bytes(b"y" * 10)
    (tmp_path / "c.py").write_bytes(b"z" * 10)
    corpus = load_stdlib_corpus(12, source_dir=tmp_path)
    assert corpus.data == b"x" * 10 + SEPARATOR[:2]
    assert corpus.files == ("a.py", "b.py")


def test_folder_without_py_files_is_a_corpus_error(tmp_path):
    with pytest.raises(CorpusError, match=r"no \*\.py files"):
        load_stdlib_corpus(100, source_dir=tmp_path)
