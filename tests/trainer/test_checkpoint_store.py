"""A checkpoint is complete only with .metadata and a matching marker; partial ones are never picked (FC-11)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stormwatch.trainer.checkpoint import store


def _fake_save(
    root: Path, step: int, *, metadata=True, marker=True, files=("__0_0.distcp",)
) -> Path:
    """What a finished save leaves behind, minus whatever the flags remove."""
    tmp = root / store.tmp_dir_name(step, attempt=0)
    tmp.mkdir(parents=True)
    for name in files:
        (tmp / name).write_bytes(b"shard")
    if metadata:
        (tmp / store.METADATA_NAME).write_bytes(b"meta")
    if marker:
        names = sorted(p.name for p in tmp.iterdir())
        store.write_marker(
            tmp,
            store.CompletionMarker(
                step=step, files=names, world_size=1, dp=1, tp=1, attempt=0, time=time.time()
            ),
        )
    return tmp


def test_committed_save_is_complete(tmp_path):
    final = store.commit(_fake_save(tmp_path, 4), 4)
    assert final.name == "step-00000004"
    assert store.incomplete_reason(final) is None
    found = store.scan(tmp_path)
    assert [c.step for c in found.complete] == [4]
    assert found.latest is not None and found.latest.marker.files == [".metadata", "__0_0.distcp"]
    assert found.partial == ()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / store.METADATA_NAME).unlink(), "no .metadata"),
        (lambda d: (d / store.MARKER_NAME).unlink(), "not committed"),
        (lambda d: (d / store.MARKER_NAME).write_text("{not json"), "unreadable"),
        (lambda d: (d / "__0_0.distcp").unlink(), "missing"),
        (lambda d: d.rename(d.with_name("step-00000005")), "marker says step 4"),
    ],
)
def test_fc11_damaged_checkpoint_is_partial(tmp_path, damage, reason):
    final = store.commit(_fake_save(tmp_path, 4), 4)
    damage(final)
    found = store.scan(tmp_path)
    assert found.complete == ()
    assert len(found.partial) == 1
    assert reason in found.partial[0].reason


def test_fc11_shards_without_marker_or_metadata_are_skipped_for_the_latest_complete(tmp_path):
    store.commit(_fake_save(tmp_path, 2), 2)
    store.commit(_fake_save(tmp_path, 4), 4)
    crashed_in_tmp = _fake_save(tmp_path, 6, metadata=False, marker=False)
    (tmp_path / "step-00000008").mkdir()  # a final name holding only shards
    (tmp_path / "step-00000008" / "__0_0.distcp").write_bytes(b"shard")
    (tmp_path / "unrelated").mkdir()
    found = store.scan(tmp_path)
    assert found.latest is not None and found.latest.step == 4
    assert {p.path for p in found.partial} == {crashed_in_tmp, tmp_path / "step-00000008"}


def test_fc11_resaving_a_step_sets_its_partial_folder_aside_and_keeps_it(tmp_path):
    partial = tmp_path / "step-00000006"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"old shard")
    final = store.commit(_fake_save(tmp_path, 6), 6)
    assert final == partial
    assert store.incomplete_reason(final) is None
    assert (final / "__0_0.distcp").read_bytes() == b"shard"
    (aside,) = [p for p in tmp_path.iterdir() if p != final]  # not this save's to delete
    assert aside.name.startswith("step-00000006.damaged-")
    assert (aside / "__0_0.distcp").read_bytes() == b"old shard"
    assert store.scan(tmp_path).partial == ()  # no checkpoint pattern matches it


def test_prune_never_deletes_a_partial_final_folder_or_a_file(tmp_path):
    for step in (2, 4):
        store.commit(_fake_save(tmp_path, step), step)
    (tmp_path / "step-00000003").mkdir()  # a final name holding only shards: damage, or a copy
    (tmp_path / "step-00000003" / "__0_0.distcp").write_bytes(b"shard")
    (tmp_path / "step-00000099").write_text("a stray file")
    crashed = _fake_save(tmp_path, 6, marker=False)
    assert sorted(store.prune(tmp_path, keep=1)) == [tmp_path / "step-00000002", crashed]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000003",
        "step-00000004",
        "step-00000099",
    ]


def test_commit_refuses_to_replace_a_complete_checkpoint(tmp_path):
    store.commit(_fake_save(tmp_path, 6), 6)
    with pytest.raises(FileExistsError):
        store.commit(_fake_save(tmp_path, 6), 6)


def test_prune_keeps_the_newest_complete_and_removes_partials(tmp_path):
    for step in (2, 4, 6, 8):
        store.commit(_fake_save(tmp_path, step), step)
    _fake_save(tmp_path, 10, marker=False)
    removed = store.prune(tmp_path, keep=2)
    assert len(removed) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006", "step-00000008"]


def test_scan_of_missing_folder_is_empty(tmp_path):
    found = store.scan(tmp_path / "absent")
    assert found.latest is None and found.partial == ()


def test_marker_checksums_detect_a_damaged_file(tmp_path):
    tmp = _fake_save(tmp_path, 6, marker=False)
    names = sorted(p.name for p in tmp.iterdir())
    store.write_marker(
        tmp,
        store.CompletionMarker(
            step=6, files=names, world_size=1, dp=1, tp=1, attempt=0, time=time.time(),
            checksums={name: store.file_checksum(tmp / name) for name in names},
        ),
    )  # fmt: skip
    final = store.commit(tmp, 6)
    checkpoint = store.scan(tmp_path).latest
    assert checkpoint is not None and store.checksum_mismatch(checkpoint) is None
    assert store.sound(final)
    (final / "__0_0.distcp").write_bytes(b"shard but flipped")
    reason = store.checksum_mismatch(checkpoint)
    assert reason is not None and "checksum mismatch in __0_0.distcp" in reason
    assert not store.sound(final)
    # a new save of the same step takes the name; the corrupt folder is set aside, kept
    replacement = store.commit(_fake_save(tmp_path, 6), 6)
    assert replacement == final and store.sound(final)
    (aside,) = [p for p in tmp_path.iterdir() if store.DAMAGED_INFIX in p.name]
    assert (aside / "__0_0.distcp").read_bytes() == b"shard but flipped"


def test_markers_without_checksums_still_count_as_complete(tmp_path):
    final = store.commit(_fake_save(tmp_path, 2), 2)
    assert store.read_marker(final).checksums == {}
    assert store.sound(final)
