"""Start-up mistakes of `stormwatch train`: unwritable folders fail first, and once per job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.cli import main
from stormwatch.trainer.paths import PROBE_PREFIX, DirOption, check_writable_dirs

UNWRITABLE = "/proc/stormwatch-no-such-dir"  # even root cannot create folders in /proc


@pytest.fixture
def plain_process_env(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("STORMWATCH_METRICS_DIR", "STORMWATCH_CONTROL_DIR", "STORMWATCH_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--checkpoint-dir", UNWRITABLE], "--checkpoint-dir"),
        (["--log-dir", UNWRITABLE], "--log-dir"),
        (["--metrics-dir", UNWRITABLE], "--metrics-dir"),
        (["--control-dir", UNWRITABLE], "--control-dir"),
        (["--dump-dir", UNWRITABLE], "--dump-dir"),
        (["--spans-dir", UNWRITABLE], "--spans-dir"),
    ],
)
def test_unwritable_folder_option_is_a_config_error_naming_it(
    plain_process_env, capsys, args, option
):
    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "1", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {option}: cannot create or write the folder {UNWRITABLE}" in err
    assert "pass a folder this user can create and write" in err
    assert "Traceback" not in err


def test_unwritable_folder_under_a_file_names_the_option(plain_process_env, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "1", "--log-dir", str(tmp_path / "file" / "logs")])
    assert info.value.code == 2
    assert "--log-dir: cannot create or write the folder" in capsys.readouterr().err


def test_unwritable_folder_fails_before_torch_is_imported():
    code = (
        "import sys\n"
        "from stormwatch.cli import main\n"
        "try:\n"
        f"    main(['train', '--steps', '1', '--checkpoint-dir', {UNWRITABLE!r}])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 2, exc.code\n"
        "assert 'torch' not in sys.modules, 'torch imported before the folder check'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--checkpoint-dir" in done.stderr
    assert "Traceback" not in done.stderr


def test_writable_folders_are_created_and_left_without_probe_files(tmp_path):
    folders = [tmp_path / "a" / "b", tmp_path / "c"]
    check_writable_dirs([DirOption("--log-dir", folders[0]), DirOption("--dump-dir", folders[1])])
    for folder in folders:
        assert folder.is_dir()
        assert not [p for p in folder.iterdir() if p.name.startswith(PROBE_PREFIX)]


def _stormwatch() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


def _rank(rank: int, args: list[str], *, local_rank: int | None = None) -> subprocess.Popen[str]:
    env = _clean_env(
        RANK=str(rank), LOCAL_RANK=str(rank if local_rank is None else local_rank), WORLD_SIZE="2"
    )
    return subprocess.Popen(
        [_stormwatch(), "train", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_option_mistake_under_torchrun_is_printed_by_rank_0_only():
    """The ranks of `torchrun --nproc-per-node 2 ... --dp 3 --tp 1`, started by hand."""
    procs = [_rank(rank, ["--dp", "3", "--tp", "1"]) for rank in (0, 1)]
    (_, err0), (out1, err1) = (p.communicate(timeout=60) for p in procs)
    assert [p.returncode for p in procs] == [2, 2]
    assert err0.count("error: ") == 1
    assert "dp_shard=3 x tp=1 = 3 ranks, but the world size is 2" in err0
    assert (out1, err1) == ("", "")


def test_unwritable_folder_is_printed_by_the_first_rank_of_each_node():
    """Folders may differ between nodes: local rank 0 of every node reports them."""
    procs = [
        _rank(0, ["--log-dir", UNWRITABLE]),
        _rank(1, ["--log-dir", UNWRITABLE], local_rank=0),  # first rank of a second node
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert f"--log-dir: cannot create or write the folder {UNWRITABLE}" in err
