"""The public telemetry API, used right, in a real process: the records and metrics the node
agent reads (docs/ARCHITECTURE.md "Trainer -> agent telemetry")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

import stormwatch.telemetry as swt
from stormwatch.telemetry.dump import rank_dump_paths


def run_job(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with the telemetry folders under ``tmp_path``."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))
    }
    environ.update(
        STORMWATCH_METRICS_DIR=str(tmp_path / "metrics"),
        STORMWATCH_LOG_DIR=str(tmp_path / "logs"),
        STORMWATCH_DUMP_DIR=str(tmp_path / "dumps"),
        STORMWATCH_JOB="api",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def samples(metrics_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("training_job", "rank"))),
        ): (s.value)
        for family in registry.collect()
        for s in family.samples
    }


def events(tmp_path: Path, rank: int = 0) -> list[dict[str, object]]:
    lines = (tmp_path / "logs" / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_the_package_exports_what_its_all_lists() -> None:
    assert sorted(swt.__all__) == sorted(set(swt.__all__))
    for name in swt.__all__:
        assert getattr(swt, name) is not None, name


def test_two_lines_give_the_step_records_metrics_and_done_marker(tmp_path: Path) -> None:
    out = run_job(
        """
        import time
        import stormwatch.telemetry as swt
        swt.init()
        for step in range(1, 4):
            time.sleep(0.02)
            swt.step(step, loss=1.0 / step, tokens=64, samples=2, lr=0.1, grad_norm=0.5)
        """,
        tmp_path,
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        TORCHELASTIC_RESTART_COUNT="3",
    )
    assert out.returncode == 0, out.stderr
    assert "not started by torchrun" not in out.stderr
    records = events(tmp_path, rank=1)
    assert [r["event"] for r in records] == ["start", "step", "step", "step", "done"]
    start, *steps, done = records
    assert (start["rank"], start["attempt"], start["world_size"]) == (1, 3, 2)
    assert start["resumed_from_step"] is None
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert steps[1]["loss_hex"] == float.hex(0.5)
    assert all(0.015 < r["step_seconds"] < 5 for r in steps[1:])
    assert done["step"] == 3
    assert (tmp_path / "metrics" / "rank1.done").exists()
    found = samples(tmp_path / "metrics")
    assert found[("stormwatch_train_step", ())] == 3
    assert found[("stormwatch_train_steps_total", ())] == 3
    assert found[("stormwatch_train_tokens_total", ())] == 192
    assert found[("stormwatch_train_samples_total", ())] == 6
    assert found[("stormwatch_train_learning_rate", ())] == 0.1
    assert found[("stormwatch_train_grad_norm", ())] == 0.5
    assert found[("stormwatch_train_world_size", ())] == 2
    assert found[("stormwatch_train_node_restarts", ())] == 3
    beat = found[("stormwatch_train_last_step_timestamp_seconds", ())]
    assert found[("stormwatch_train_last_progress_timestamp_seconds", ())] >= beat > 0


def test_a_phase_exports_its_deadline_and_is_left_out_of_the_step_time(tmp_path: Path) -> None:
    out = run_job(
        """
        import time
        import stormwatch.telemetry as swt
        swt.init()
        swt.step(1)
        with swt.phase("checkpoint_save"):
            time.sleep(0.5)
        with swt.phase("data_wait"):  # part of the step
            time.sleep(0.2)
        swt.step(2)
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    second = [r for r in events(tmp_path) if r["event"] == "step"][1]
    assert 0.2 <= second["step_seconds"] < 0.45  # the save's 0.5 s is not step time
    deadline = samples(tmp_path / "metrics")[
        ("stormwatch_train_phase_deadline_timestamp_seconds", (("phase", "checkpoint_save"),))
    ]
    assert deadline == 0  # left (the value inside: the next test)


@pytest.mark.parametrize(
    ("call", "bound"),
    [
        pytest.param('swt.phase("eval")', 42.0, id="the-configured-bound"),
        # issue 18: a bound for one entry (the trainer's saves: 3 x its longest save)
        pytest.param('swt.phase("eval", bound_seconds=77)', 77.0, id="a-bound-for-this-entry"),
        # the job's override (eval=42) is a minimum of a bound given for one entry
        pytest.param('swt.phase("eval", bound_seconds=7.5)', 42.0, id="the-override-is-a-minimum"),
        # a bad one: one warning, the configured bound
        pytest.param('swt.phase("eval", bound_seconds=-1)', 42.0, id="a-bad-bound-is-ignored"),
    ],
)
def test_inside_a_phase_the_deadline_is_entry_plus_the_bound(
    tmp_path: Path, call: str, bound: float
) -> None:
    code = f"""
        import sys, time
        import stormwatch.telemetry as swt
        swt.init()
        with {call}:
            print(time.time(), flush=True)
            sys.stdin.readline()
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STORMWATCH_")}
    environ.update(
        STORMWATCH_METRICS_DIR=str(tmp_path / "metrics"),
        STORMWATCH_JOB="api",
        STORMWATCH_PHASE_BOUNDS="eval=42",
    )
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        entered = float(proc.stdout.readline())
        deadline = samples(tmp_path / "metrics")[
            ("stormwatch_train_phase_deadline_timestamp_seconds", (("phase", "eval"),))
        ]
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert entered + bound - 1 < deadline < entered + bound + 1
    assert ("bound_seconds=-1" in err) == ("-1" in call), err


def test_the_heartbeat_starts_before_the_process_group_in_the_rendezvous_stage(
    tmp_path: Path,
) -> None:
    """init(collectives=True) marks rendezvous around init_process_group: inside it the rank
    has a heartbeat and the stage's deadline, before any step or collective."""
    out = run_job(
        """
        import json, threading, time
        from datetime import timedelta
        import torch.distributed as dist
        import stormwatch.telemetry as swt
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector
        swt.init()
        seen = {}
        def look():  # the rank's gauges while it waits in init_process_group for rank 1
            time.sleep(1.0)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(swt.session().settings.metrics_dir))
            seen.update({
                s.labels.get("phase", s.name): s.value
                for f in registry.collect() for s in f.samples
                if "phase_deadline" in s.name or "progress" in s.name
            })
            seen["now"] = time.time()
        looking = threading.Thread(target=look)
        looking.start()
        try:  # rank 1 never comes
            dist.init_process_group(
                "gloo", store=dist.HashStore(), rank=0, world_size=2, timeout=timedelta(seconds=3)
            )
        except Exception as exc:
            seen["failed"] = type(exc).__name__
        looking.join()
        print(json.dumps(seen))
        """,
        tmp_path,
        STORMWATCH_PHASE_BOUNDS="rendezvous=42",
    )
    assert out.returncode == 0, out.stderr
    inside = json.loads(out.stdout.splitlines()[-1])
    now = inside["now"]
    assert "failed" in inside  # the rendezvous never completed
    assert now - 5 < inside["stormwatch_train_last_progress_timestamp_seconds"] <= now
    assert now + 35 < inside["rendezvous"] < now + 43  # entry + its bound
    after = samples(tmp_path / "metrics")
    assert (
        after[("stormwatch_train_phase_deadline_timestamp_seconds", (("phase", "rendezvous"),))]
        == 0
    )


def test_a_dump_after_an_exception_left_a_stage_names_that_stage(tmp_path: Path) -> None:
    out = run_job(
        """
        import stormwatch.telemetry as swt
        session = swt.init(collectives=False)
        try:
            with swt.phase("parallelize"):
                raise RuntimeError("out of memory")
        except RuntimeError as exc:
            session.dump(f"RuntimeError: {exc}")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    [path] = rank_dump_paths(tmp_path / "dumps", 0)
    dump = json.loads(path.read_text())
    assert dump["phase"] == "parallelize" and dump["step"] is None


@pytest.mark.parametrize(
    ("given", "environ", "job", "warned"),
    [
        (None, {"STORMWATCH_JOB": "a", "TORCHELASTIC_RUN_ID": "r"}, "a", False),
        (None, {"TORCHELASTIC_RUN_ID": "r", "SLURM_JOB_NAME": "s"}, "r", False),
        (None, {"SLURM_JOB_NAME": "s"}, "s", False),
        (None, {}, "train", False),
        ("a", {"STORMWATCH_JOB": "a", "TORCHELASTIC_RUN_ID": "r"}, "a", False),
        ("x", {"TORCHELASTIC_RUN_ID": "r"}, "x", True),
        ("x", {"STORMWATCH_JOB": "a"}, "x", True),
        ("x", {"SLURM_JOB_NAME": "s"}, "x", False),
        ("", {"TORCHELASTIC_RUN_ID": "r"}, "r", True),
    ],
)
def test_the_job_name_is_the_one_the_node_agent_reads_or_a_warning_says_how_to_align_them(
    given: str | None, environ: dict[str, str], job: str, warned: bool
) -> None:
    """The agent keys a rank by ``STORMWATCH_JOB``, else torchrun's run id
    (:func:`stormwatch.contracts.rank_env.rank_env`): the API's default is the same, and a
    ``job=`` that differs from it says to set ``STORMWATCH_JOB``."""
    from stormwatch.contracts.rank_env import rank_env
    from stormwatch.telemetry.lifecycle.launch import resolve_job

    name, problem = resolve_job(given, environ)
    assert name == job and (problem is not None) == warned, problem
    if problem is not None and given:
        assert f"STORMWATCH_JOB={given}" in problem
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    seen = rank_env({**ranks, **environ}) if "TORCHELASTIC_RUN_ID" in environ else None
    if seen is not None and not warned:
        assert seen.job == name


@pytest.mark.parametrize(
    ("before", "restarts", "resumed"),
    [
        ("", "0", None),  # a fresh run marking every 10th step starts fresh
        ("", "1", 9),  # a restart: its first mark follows the step it resumed from
        ("with swt.phase('checkpoint_load'):\n    pass", "0", 9),  # a resumed submission
    ],
    ids=["fresh", "restart", "checkpoint-loaded"],
)
def test_a_run_that_marks_every_nth_step_is_resumed_only_when_it_resumes(
    tmp_path: Path, before: str, restarts: str, resumed: int | None
) -> None:
    code = "import stormwatch.telemetry as swt\nswt.init()\n" + before + "\n"
    code += "for step in (10, 20, 30):\n    swt.step(step, loss=1.0)\n"
    out = run_job(
        code, tmp_path, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
        TORCHELASTIC_RESTART_COUNT=restarts,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    start = events(tmp_path)[0]
    assert (start["event"], start["resumed_from_step"]) == ("start", resumed)


def test_a_save_cut_short_by_a_stop_or_a_lost_peer_is_not_counted_as_failed(
    tmp_path: Path,
) -> None:
    """The soak's end-to-end test (2026-12-06): a peer that left mid-save (an elastic
    resize) counted a failed save on the ranks left, and StormwatchCheckpointFailing fired
    on a fault-free job. The reference trainer re-raises such a failure itself; a job using
    the API (Lightning's callback reports the exception a save raised) hands it over."""
    out = run_job(
        """
        import torch.distributed as dist
        import stormwatch.telemetry as swt
        swt.init()
        swt.step(1)
        swt.checkpoint(1, error=OSError(28, "No space left on device"))
        swt.checkpoint(2, error=RuntimeError(
            "[pair.cc:553] Connection closed by peer [10.213.0.11]:17334"))
        swt.checkpoint(3, error=dist.DistBackendError("NCCL communicator was aborted"))
        swt.checkpoint(4, error="Connection closed by peer")  # text: not told apart
        swt.session().stop_requested()
        swt.checkpoint(5, error=OSError(5, "Input/output error"))
        swt.shutdown()
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    failed = [e for e in events(tmp_path) if e["event"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [1, 4]
    assert samples(tmp_path / "metrics")[("stormwatch_train_checkpoint_failures_total", ())] == 2
