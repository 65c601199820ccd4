"""`stormwatch train --global-batch` / `--dp auto`: mistakes are named with their fix, before torch."""

from __future__ import annotations

import pytest

from stormwatch.cli import main


@pytest.fixture
def world_of_four(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")


@pytest.mark.parametrize("dp", [["--dp", "auto"], []])
def test_a_global_batch_that_dp_does_not_divide_names_the_flags_and_the_fix(
    world_of_four, capsys, dp
):
    with pytest.raises(SystemExit) as info:
        main(["train", *dp, "--micro-batch", "2", "--global-batch", "12"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "global_batch: 12 is not a multiple of micro_batch x dp = 2 x 4 = 8" in err
    assert "pass --global-batch as a multiple of 8" in err and "--micro-batch" in err
    assert "Traceback" not in err


def test_dp_is_an_integer_or_auto(world_of_four, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--dp", "most"])
    assert info.value.code == 2
    assert "'most' is neither an integer nor 'auto'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--global-batch", str(10**12)], "--global-batch"),
        (["--micro-batch", "2000000"], "--micro-batch"),
    ],
)
def test_a_batch_larger_than_the_corpus_has_sequences_names_the_flag_and_the_bound(
    world_of_four, capsys, args, flag
):
    with pytest.raises(SystemExit) as info:
        main(["train", *args, "--corpus-max-bytes", "65536", "--seq-len", "64"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "more than the corpus has distinct ones" in err
    assert "65536 - 64 - 1 = 65471" in err and f"pass {flag} <= 65471" in err
    assert "--corpus-max-bytes" in err and "Traceback" not in err


def test_a_batch_of_all_the_corpus_sequences_is_accepted():
    from stormwatch.trainer.config import DataConfig

    config = DataConfig(seq_len=64, micro_batch=1, global_batch=65471, corpus_max_bytes=65536)
    assert config.max_batch == 65471 and config.accumulation_steps(1) == 65471
