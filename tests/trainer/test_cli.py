"""`stormwatch train`: fast help, clear errors for bad options, and the public API."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stormwatch.trainer as trainer
from stormwatch.cli import main


def test_train_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from stormwatch.cli import main\n"
        "try:\n"
        "    main(['train', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported by --help'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    for option in ("--steps", "--dp", "--tp", "--checkpoint-dir", "--step-delay", "STORMWATCH_JOB"):
        assert option in done.stdout


@pytest.fixture
def plain_process_env(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dp", "2", "--tp", "2"], "run it under torchrun --nproc-per-node 4"),
        (["--pp", "2", "--dp-replicate", "2"], "run it under torchrun --nproc-per-node 4"),
        (["--pp", "0"], "pp: must be an integer >= 1"),
        (["--dp-replicate", "0"], "dp_replicate: must be an integer >= 1"),
        (["--dp", "0"], "'--dp': 0 is not a degree: give an integer >= 1, or 'auto'"),
        (["--dp", "-2"], "'--dp': -2 is not a degree: give an integer >= 1, or 'auto'"),
        (["--dp", "two"], "'two' is neither an integer nor 'auto'"),
        (["--steps", "0"], "steps: must be an integer >= 1"),
        (["--lr", "-1"], "lr: must be a finite number > 0"),
        (["--d-model", "30", "--n-heads", "4"], "error: d_model: must be divisible by n_heads"),
        (["--seq-len", "0"], "error: seq_len: must be an integer >= 1"),
        (["--micro-batch", "0"], "error: micro_batch: must be an integer >= 1"),
        (["--dropout", "1"], "error: dropout: must be in [0, 1)"),
        (["--pp-microbatches", "3"], "pp_microbatches: must divide micro_batch"),
        (["--keep", "0"], "keep: must be an integer >= 1"),
        (["--step-delay", "-0.5"], "step_delay"),
        (["--job", ""], "job: must be a non-empty"),
        (["--collective-timeout", "0"], "collective_timeout: must be a number of seconds"),
        (["--peak-flops", "-1"], "peak_flops: must be a finite number"),
        (["--otlp-endpoint", "nowhere"], "otlp_endpoint: must be an http(s) URL"),
    ],
)
def test_bad_options_are_config_errors(plain_process_env, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["train", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dp", "3", "--tp", "2"], "dp_shard=3 x tp=2 = 6 ranks, but the world size is 4"),
        (
            ["--pp", "2", "--dp", "4"],
            "pp=2 x dp_replicate=1 x dp_shard=4 x tp=1 = 8 ranks, but the world size is 4",
        ),
        (
            ["--dp-replicate", "2", "--dp", "1", "--tp", "1"],
            "dp_replicate=2 x dp_shard=1 x tp=1 = 2 ranks, but the world size is 4",
        ),
        (["--pp", "3"], "pp x dp_replicate x tp = 3 x 1 x 1 = 3: must divide the world size 4"),
        (["--pp", "2", "--pp-microbatches", "1"], "pp_microbatches: 1F1B needs at least pp=2"),
        (["--pp", "4"], "pp: must be <= n_layers"),
    ],
)
def test_degrees_not_matching_torchrun_world_size_name_both(monkeypatch, capsys, args, message):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as info:
        main(["train", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_public_api_exports_exactly_its_all():
    for name in trainer.__all__:
        assert getattr(trainer, name) is not None, name
    assert len(set(trainer.__all__)) == len(trainer.__all__)
    with pytest.raises(AttributeError):
        _ = trainer.not_a_name


def test_missing_otlp_exporter_is_named_before_training_starts(plain_process_env, capsys):
    pytest.importorskip("opentelemetry.sdk")
    from stormwatch.otel import OTLP_PACKAGE
    from stormwatch.trainer.config import check_otlp_available

    try:
        check_otlp_available()
    except Exception:
        pass
    else:
        pytest.skip(f"{OTLP_PACKAGE} is installed")
    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "1", "--otlp-endpoint", "http://127.0.0.1:9/v1/traces"])
    assert info.value.code == 2
    assert f"pip install {OTLP_PACKAGE}" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://[::1", "http://h:99999/v1/traces", "notaurl"])
def test_an_otlp_endpoint_that_does_not_parse_stops_train_before_it_starts(
    plain_process_env, capsys, url
):
    """A URL urlsplit cannot parse used to pass (only its prefix was checked): the run
    trained and lost every span."""
    with pytest.raises(SystemExit) as info:
        main(["train", "--steps", "1", "--otlp-endpoint", url])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "otlp_endpoint: must be an http(s) URL such as" in err and "train: done" not in err
