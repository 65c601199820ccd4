"""The telemetry API used wrongly never breaks the training loop: each misuse is ONE clear
warning on the ``stormwatch.telemetry`` logger naming the argument and the fix, and the
call is ignored (issue 16). Real processes: each case is a small training loop in a fresh
process that must run to its end. The processes are forked, one per case, from one
interpreter that imported ``stormwatch.telemetry`` and torch once (every case paid seconds
of CPU importing torch when each was a fresh interpreter); each child takes its case's
environment and output files, runs the loop as ``python -c`` would and exits through the
interpreter's own shutdown (``atexit``), so its telemetry state and warnings are its own."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.telemetry.lifecycle.checks import step_args
from stormwatch.telemetry.lifecycle.guard import WARNINGS

#: A loop of 5 steps around the misuse; it prints "loop done" when it got through.
LOOP = """
import logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
import stormwatch.telemetry as swt
{before}
for step in range(1, 6):
    {each}
    swt.step(step, loss=1.0 / step)
{after}
print("loop done", flush=True)
"""


#: Reads one case a line (JSON: env, code, stdout, stderr), forks a child that runs it,
#: and answers its exit status a line. The child leaves the loop and runs the case's code
#: as the script's own (an exception: a traceback and status 1; the end: interpreter exit).
ZYGOTE = """
import json, os, sys
import stormwatch.telemetry, torch, torch.distributed
for line in sys.stdin:
    case = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
else:
    sys.exit(0)
os.environ.clear()
os.environ.update(case["env"])
for fd, path in ((1, case["stdout"]), (2, case["stderr"])):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(target, fd)
    os.close(target)
exec(compile(case["code"], "<string>", "exec"), {"__name__": "__main__"})
"""


@pytest.fixture(scope="module")
def run_loop() -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """``run_loop(tmp_path, before=, each=, after=, **env)``: :data:`LOOP` in a process of
    its own (forked from the module's one interpreter), in the environment of a rank 0 of 1
    under torchrun plus ``env`` (``""``: unset); its exit status and output."""
    with subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as zygote:
        assert zygote.stdin is not None and zygote.stdout is not None
        yield functools.partial(_run_forked, zygote)
        zygote.stdin.close()  # its loop ends: it exits
        zygote.wait(timeout=60)


def _run_forked(
    zygote: subprocess.Popen[str],
    tmp_path: Path,
    *,
    before: str = "swt.init()",
    each: str = "pass",
    after: str = "",
    **env: str,
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))
    }
    environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "STORMWATCH_METRICS_DIR": str(tmp_path / "metrics"),
            "STORMWATCH_LOG_DIR": str(tmp_path / "logs"),
            **env,
        }
    )
    environ = {k: v for k, v in environ.items() if v}  # "": unset
    code = LOOP.format(before=textwrap.dedent(before), each=each, after=after)
    out, err = tmp_path / "loop.stdout", tmp_path / "loop.stderr"
    case = {"env": environ, "code": code, "stdout": str(out), "stderr": str(err)}
    assert zygote.stdin is not None and zygote.stdout is not None
    zygote.stdin.write(json.dumps(case) + "\n")
    zygote.stdin.flush()
    status = zygote.stdout.readline()
    assert status, "the forking interpreter died"
    return subprocess.CompletedProcess(code, int(status), out.read_text(), err.read_text())


def warnings_of(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("WARNING")]


#: case -> (code before the loop, code in each step, words the ONE warning must hold)
CASES = {
    "step_before_init": (
        "swt.step(0)\nswt.step(1)\nswt.init()",
        "pass",
        ["step() before init()", "call stormwatch.telemetry.init() first"],
    ),
    "phase_before_init": (
        "with swt.phase('eval'): pass\nswt.init()",
        "pass",
        ["phase() before init()", "call stormwatch.telemetry.init() first"],
    ),
    "init_twice_with_other_arguments": (
        "swt.init(job='a')\nswt.init(job='b')\nassert swt.init(job='a') is swt.session()",
        "swt.init(job='c')",
        ["init() called again with other arguments", "job='a'"],
    ),
    "init_with_arguments_after_stormwatch_run_started_the_session": (
        "import os\nos.environ['STORMWATCH_RUN_RANK_PID'] = str(os.getpid())\n"
        "swt.init()\nswt.init(job='mine')",
        "pass",
        ["init(job='mine' (kept None)) is ignored: `stormwatch run` already started", "--job"],
    ),
    "negative_step": ("swt.init()", "swt.step(-step)", ["step=-1", "int >= 0"]),
    "non_integer_step": ("swt.init()", "swt.step(step + 0.5)", ["step=1.5", "int >= 0"]),
    "step_as_text": ("swt.init()", "swt.step(str(step))", ["step='1'", "int >= 0"]),
    "loss_not_a_number": ("swt.init()", "swt.step(step, loss='low')", ["loss='low'", "number"]),
    "loss_beyond_a_float": (
        "swt.init()",
        "swt.step(step, loss=10**400)",
        ["loss=<int of 401 digits>", "too large for a float"],
    ),
    "negative_tokens": ("swt.init()", "swt.step(step, tokens=-5)", ["tokens=-5", "int >= 0"]),
    "nan_loss": (
        "swt.init()",
        "swt.step(step, loss=float('nan'))",
        ["loss=nan", "not finite", "StormwatchLossNaN"],
    ),
    "unknown_phase": (
        "swt.init()",
        "with swt.phase('evaluation'): pass",
        ["phase('evaluation')", "unknown phase", "checkpoint_save, checkpoint_load, eval"],
    ),
    "checkpoint_with_a_bad_step": (
        "swt.init()",
        "swt.checkpoint(None)",
        ["checkpoint(None)", "int >= 0"],
    ),
    "calls_after_shutdown": (
        "swt.init()",
        "pass",
        ["step() after shutdown()", "init() again"],
    ),
    "session_method_with_an_unknown_argument": (
        "session = swt.init()",
        "session.step(step, los=1.0)",
        ["Session.step(step: int, *, loss:", "unexpected keyword argument 'los'", "ignored"],
    ),
    "module_function_without_its_step": (
        "swt.init()",
        "swt.checkpoint()",
        ["stormwatch.telemetry.checkpoint(step: int", "missing a required argument"],
    ),
    "flight_recorder_beyond_the_largest_ring": (
        "swt.init(flight_recorder=10**20)",
        "pass",
        ["flight_recorder=100000000000000000000", "largest ring, 1000000 entries"],
    ),
    "bad_flag": (
        "swt.init(collectives='yes')",
        "pass",
        ["collectives='yes'", "True or False"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_misuse_is_one_clear_warning_and_the_loop_goes_on(
    tmp_path: Path, case: str, run_loop: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    before, each, words = CASES[case]
    if case == "calls_after_shutdown":
        before = "swt.init(); swt.shutdown()"
    done = run_loop(tmp_path, before=before, each=each)
    assert done.returncode == 0, done.stderr
    assert "loop done" in done.stdout
    assert "Traceback" not in done.stderr
    found = warnings_of(done)
    assert len(found) == 1, found
    assert found[0].startswith("WARNING stormwatch.telemetry: "), found
    assert "please report" not in found[0], "a user's mistake blamed on stormwatch"
    for word in words:
        assert word in found[0], (word, found[0])


def test_a_process_without_a_launcher_is_rank_0_of_1_with_one_warning(
    tmp_path: Path, run_loop: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    done = run_loop(tmp_path, RANK="", WORLD_SIZE="", LOCAL_RANK="")
    assert done.returncode == 0 and "loop done" in done.stdout, done.stderr
    [warning] = warnings_of(done)
    assert "not started by torchrun or srun" in warning and "rank 0 of 1" in warning
    assert (tmp_path / "logs" / "rank0.jsonl").exists()


def test_srun_placement_is_read_when_there_is_no_torchrun(
    tmp_path: Path, run_loop: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    done = run_loop(
        tmp_path,
        RANK="",
        WORLD_SIZE="",
        LOCAL_RANK="",
        SLURM_PROCID="3",
        SLURM_LOCALID="1",
        SLURM_NTASKS="4",
        SLURM_RESTART_COUNT="2",
        SLURM_JOB_NAME="slurmjob",
    )
    assert done.returncode == 0 and warnings_of(done) == [], done.stderr
    start = (tmp_path / "logs" / "rank3.jsonl").read_text().splitlines()[0]
    assert '"rank": 3, "attempt": 2' in start and '"world_size": 4' in start
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path / "metrics"))
    labels = {
        (s.labels["training_job"], s.labels["rank"])
        for family in registry.collect()
        for s in family.samples
        if s.name == "stormwatch_train_step"
    }
    assert labels == {("slurmjob", "3")}


def test_an_unwritable_metrics_dir_turns_metrics_off_with_one_warning(
    tmp_path: Path, run_loop: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = run_loop(tmp_path, STORMWATCH_METRICS_DIR=str(blocker / "metrics"))
    assert done.returncode == 0 and "loop done" in done.stdout, done.stderr
    [warning] = warnings_of(done)
    assert "STORMWATCH_METRICS_DIR=" in warning and "cannot be written" in warning
    assert "pass a writable folder, or unset STORMWATCH_METRICS_DIR" in warning
    assert (tmp_path / "logs" / "rank0.jsonl").exists()  # the other outputs still work


def test_a_bad_phase_bound_keeps_the_default_with_one_warning(
    tmp_path: Path, run_loop: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    done = run_loop(tmp_path, STORMWATCH_PHASE_BOUNDS="eval=-3,sleep=5")
    assert done.returncode == 0, done.stderr
    [warning] = warnings_of(done)
    assert "STORMWATCH_PHASE_BOUNDS" in warning and "eval=-3" in warning


@pytest.mark.parametrize(
    ("kwargs", "ok", "left_out"),
    [
        ({"step": 3}, True, None),
        ({"step": 0}, True, None),
        ({"step": True}, False, None),
        ({"step": -1}, False, None),
        ({"step": 2.0}, False, None),
        ({"step": 3, "loss": math.inf}, True, None),  # recorded, with a warning
        ({"step": 3, "loss": [1.0]}, True, "loss"),  # the step stays, the bad value goes
        ({"step": 3, "samples": 1.5}, True, "samples"),
        ({"step": 3, "lr": "0.1"}, True, "learning_rate"),
        ({"step": 3, "grad_norm": None}, True, None),
    ],
)
def test_step_arguments_are_checked(
    kwargs: dict[str, object], ok: bool, left_out: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad step number drops the mark; a bad optional argument drops only itself (a
    ``get_last_lr()`` list must not cost every step's heartbeat), with its warning."""
    base = {"loss": None, "tokens": None, "samples": None, "lr": None, "grad_norm": None}
    step = kwargs.pop("step")
    try:
        checked = step_args(step, **{**base, **kwargs})
    finally:
        WARNINGS.reset()
    assert (checked is not None) == ok
    if left_out is not None:
        assert checked is not None and getattr(checked, left_out) is None
        assert "left out of this step mark" in caplog.text, caplog.text


def test_each_different_mistake_with_an_argument_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One warning per argument and kind of value: a later, different mistake is still said."""
    try:
        for _ in range(3):
            assert (
                step_args(-1, **dict.fromkeys(("loss", "tokens", "samples", "lr", "grad_norm")))
                is None
            )
            assert (
                step_args("3", **dict.fromkeys(("loss", "tokens", "samples", "lr", "grad_norm")))
                is None
            )
    finally:
        WARNINGS.reset()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "step=-1" in said[0] and "step='3'" in said[1], said


def test_a_loss_tensor_that_requires_grad_is_read_without_autograd_warnings() -> None:
    torch = pytest.importorskip("torch")
    loss = (torch.ones(1, requires_grad=True) * 2.5).sum()
    try:
        checked = step_args(1, loss=loss, tokens=None, samples=None, lr=None, grad_norm=None)
    finally:
        WARNINGS.reset()
    assert checked is not None and checked.loss == 2.5
