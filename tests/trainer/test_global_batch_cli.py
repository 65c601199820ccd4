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
