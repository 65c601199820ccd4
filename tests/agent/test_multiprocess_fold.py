"""The multiprocess folder stays bounded (issue 17, item 4): exited processes' files are
folded into one accumulator that keeps every total exactly, a job's fresh start drops its
earlier start's series while an elastic restart keeps them, and the agent exports the
folder's size and its render durations.

Every file here is written by a real process through prometheus-client's multiprocess
mode, and the process has exited (or runs) for real; the agent is the real agent.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from stormwatch.agent.watch.fold import INTENT, LOCK
from stormwatch.agent.watch.folder import INSTANCES_FILE, TrainerFolder
from stormwatch.agent.watch.merge import merge
from stormwatch.agent.watch.procs import pid_dead
from stormwatch.agent.watch.trainer_files import TrainerFiles
from stormwatch.contracts.rank_env import rank_env

#: A process that writes the trainer's kinds of series with float increments spread over
#: twelve orders of magnitude (naive float sums of them depend on the order), and with
#: ``gauges`` one gauge per multiprocess mode; prints the values it holds, then exits (or,
#: with ``stay``, waits for stdin to close).
WRITER = textwrap.dedent(
    """
    import json, os, random, sys
    folder, job, seed, stay = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "stay"
    modes = ("sum", "max", "min", "mostrecent", "all", "livesum", "livemax", "liveall")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    from prometheus_client import Counter, Gauge, Histogram
    rnd = random.Random(seed)
    lab = dict(training_job=job, rank="0")
    seconds = Counter("stormwatch_collective_duration_seconds", "t", ["training_job", "rank", "op"])
    steps = Counter("stormwatch_train_steps", "s", ["training_job", "rank"])
    duration = Histogram("stormwatch_train_step_duration_seconds", "d", ["training_job", "rank"])
    gauges = {
        mode: Gauge(f"g_{mode}", "g", ["training_job", "rank"], multiprocess_mode=mode)
        for mode in (modes if sys.argv[5] == "gauges" else ())
    }
    for i in range(20):
        x = 10 ** rnd.uniform(-6, 6)
        seconds.labels(op="all_reduce", **lab).inc(x)
        steps.labels(**lab).inc()
        duration.labels(**lab).observe(x)
    value = rnd.uniform(-100, 100)
    for mode, gauge in gauges.items():
        gauge.labels(**lab).set(value)
    child = duration.labels(**lab)
    print(json.dumps({
        "pid": os.getpid(),
        "seconds": seconds.labels(op="all_reduce", **lab)._value.get(),
        "steps": steps.labels(**lab)._value.get(),
        "duration_sum": child._sum.get(),
        "buckets": [b.get() for b in child._buckets],
        "gauge": value,
    }), flush=True)
    if stay:
        sys.stdin.read()
    """
)


def _write(
    folder: Path, job: str, seed: int, *, stay: bool = False, gauges: bool = True
) -> tuple[dict[str, Any], Any]:
    """Run one writer; returns what it wrote and, with ``stay``, the running process."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    argv = [sys.executable, "-c", WRITER, str(folder), job, str(seed), "stay" if stay else "exit"]
    argv.append("gauges" if gauges else "-")
    if not stay:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True)
        return json.loads(done.stdout.splitlines()[0]), None
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return json.loads(proc.stdout.readline()), proc


def _finish(proc: Any) -> None:
    """End a writer started with ``stay``."""
    proc.communicate(timeout=30)


def _samples(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
    }


def _maintain(folder: TrainerFolder, instances: dict[str, set[str]] | None = None) -> None:
    """The rank watcher's upkeep: live gauges of exited pids go, then the fold."""
    TrainerFiles(folder.path, reader="test", folder=folder).mark_dead({})
    folder.maintain(pid_dead, instances or {})


def test_a_fold_keeps_every_total_and_bucket_to_the_last_bit(metrics_dir: Path) -> None:
    """Counters, histogram buckets and sums read identically before and after each fold
    (Prometheus takes any decrease, even one ulp, for a counter reset)."""
    folder = TrainerFolder(metrics_dir)
    _, running = _write(metrics_dir, "j", 0, stay=True)
    previous: dict[Any, float] = {}
    try:
        for seed in range(1, 13):
            _write(metrics_dir, "j", seed)
            before = _samples(folder.merge())
            _maintain(folder)
            after = _samples(folder.merge())
            sums = {k: v for k, v in before.items() if not k[0].startswith("g_")}
            assert sums == {k: v for k, v in after.items() if k in sums}
            for key, value in sums.items():
                assert value >= previous.get(key, 0.0), key  # never backwards
            previous = sums
        left = {p.name for p in metrics_dir.glob("*_[0-9]*.db")} - {
            f"{kind}_{running.pid}.db" for kind in ("counter", "histogram")
        }
        assert {n for n in left if n.startswith(("counter_", "histogram_"))} == set(), left
    finally:
        _finish(running)


def test_counters_never_go_backwards_across_folds_and_equal_the_exact_totals(
    start_agent: Any, tools: Any, metrics_dir: Path
) -> None:
    """The real agent renders while processes exit and get folded: every scrape's counter
    is at least the previous one, and once folded it is the exact sum (``math.fsum``) of
    what every process wrote, running ones included."""
    agent = start_agent()
    wrote = [_write(metrics_dir, "j", 100, stay=True, gauges=False)]
    running = wrote[0][1]
    last = {"seconds": 0.0, "sum": 0.0}
    try:
        for seed in range(101, 109):
            wrote.append(_write(metrics_dir, "j", seed, gauges=False))
            exited = len(wrote) - 1

            def folded(exited: int = exited) -> Any:
                scrape = tools.scrape(agent.url)
                seconds = scrape.value(
                    "stormwatch_collective_duration_seconds_total",
                    training_job="j",
                    rank="0",
                    op="all_reduce",
                )
                total = scrape.value(
                    "stormwatch_train_step_duration_seconds_sum", training_job="j", rank="0"
                )
                if seconds is None and not last["seconds"]:
                    return None  # not rendered yet
                assert seconds is not None and seconds >= last["seconds"]
                assert total is not None and total >= last["sum"]
                last.update(seconds=seconds, sum=total)
                done = scrape.value("stormwatch_agent_multiprocess_folded_files_total")
                return scrape if done is not None and done >= 2 * exited else None

            scrape = tools.wait_for(folded)
            values = [w for w, _ in wrote]
            assert scrape.value(
                "stormwatch_collective_duration_seconds_total",
                training_job="j",
                rank="0",
                op="all_reduce",
            ) == math.fsum(w["seconds"] for w in values)
            assert scrape.value(
                "stormwatch_train_step_duration_seconds_sum", training_job="j", rank="0"
            ) == math.fsum(w["duration_sum"] for w in values)
            assert scrape.value(
                "stormwatch_train_steps_total", training_job="j", rank="0"
            ) == 20 * len(values)
            # The running writer's two files (and the accumulator's), not two per exit.
            assert scrape.value("stormwatch_agent_multiprocess_files", training_job="j") == 2
    finally:
        _finish(running)


def test_gauges_of_exited_processes_follow_their_multiprocess_mode(metrics_dir: Path) -> None:
    """``sum``/``max``/``min``/``mostrecent`` keep exited processes' last values through the
    fold, ``all`` keeps one series per pid, ``live*`` drop exited processes."""
    folder = TrainerFolder(metrics_dir)
    first, _ = _write(metrics_dir, "j", 1)
    second, running = _write(metrics_dir, "j", 2, stay=True)
    try:
        before = _samples(folder.merge())
        _maintain(folder)
        after = _samples(folder.merge())
        lab = (("rank", "0"), ("training_job", "j"))  # sorted
        for mode in ("sum", "max", "min", "mostrecent"):
            assert after[(f"g_{mode}", lab)] == before[(f"g_{mode}", lab)]
        assert after[("g_sum", lab)] == first["gauge"] + second["gauge"]
        assert after[("g_max", lab)] == max(first["gauge"], second["gauge"])
        assert after[("g_min", lab)] == min(first["gauge"], second["gauge"])
        for mode in ("all", "liveall"):
            pids = {dict(k[1]).get("pid") for k in after if k[0] == f"g_{mode}"}
            expected = (
                {str(first["pid"]), str(second["pid"])} if mode == "all" else {str(second["pid"])}
            )
            assert pids == expected, mode
        for mode in ("livesum", "livemax"):
            assert after[(f"g_{mode}", lab)] == second["gauge"]
    finally:
        _finish(running)


CRASHING_FOLD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from stormwatch.agent.watch import fold
    from stormwatch.agent.watch.folder import TrainerFolder
    from stormwatch.agent.watch.procs import pid_dead
    def crash(self, intent):  # the agent dies right after the intent is on disk
        os._exit(9)
    fold.Accumulator._apply = crash
    TrainerFolder(Path(sys.argv[1])).maintain(pid_dead, {})
    """
)


def test_a_fold_cut_short_by_a_crash_is_finished_once_and_never_counted_twice(
    metrics_dir: Path,
) -> None:
    folder = TrainerFolder(metrics_dir)
    for seed in range(3):
        _write(metrics_dir, "j", seed)
    _maintain(folder)
    for seed in range(3, 6):
        _write(metrics_dir, "j", seed)
    expected = _samples(folder.merge())
    crashed = subprocess.run([sys.executable, "-c", CRASHING_FOLD, str(metrics_dir)], check=False)
    assert crashed.returncode == 9
    assert (metrics_dir / INTENT).exists()  # new accumulator written, exited files still there
    reopened = TrainerFolder(metrics_dir)  # a restarted agent
    assert not (metrics_dir / INTENT).exists()
    assert _samples(reopened.merge()) == expected
    assert not list(metrics_dir.glob("counter_[0-9]*.db"))
    assert _samples(merge(reopened.paths(), accumulate=True)) == expected


RESTARTING_RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ["STORMWATCH_METRICS_DIR"]
    from prometheus_client import Counter, Gauge, Histogram
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    lab = dict(training_job=os.environ["STORMWATCH_JOB"], rank=os.environ["RANK"])
    Counter("stormwatch_train_steps", "s", ["training_job", "rank"]).labels(**lab).inc(5)
    Histogram("stormwatch_train_step_duration_seconds", "d", ["training_job", "rank"]).labels(
        **lab).observe(0.01)
    Gauge("stormwatch_train_step", "s", ["training_job", "rank"], multiprocess_mode="livemax").labels(
        **lab).set(attempt)
    if attempt < int(os.environ["RESTARTS"]):
        sys.exit(1)  # the launcher restarts it, as torchrun does
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    while True:
        time.sleep(60)
    """
)


def test_the_file_count_stays_bounded_after_many_rank_restarts(
    start_agent: Any, fake_torchrun: Any, tools: Any, metrics_dir: Path
) -> None:
    restarts = 12
    agent = start_agent()
    launcher = fake_torchrun(
        [0, 1], restart=True, env={"RESTARTS": str(restarts)}, rank_code=RESTARTING_RANK
    )
    launcher.wait_pid(0, count=restarts + 1, timeout=120)
    launcher.wait_pid(1, count=restarts + 1, timeout=120)

    def settled() -> Any:
        scrape = tools.scrape(agent.url)
        folded = scrape.value("stormwatch_agent_multiprocess_folded_files_total")
        per_rank = {
            (
                scrape.value("stormwatch_train_steps_total", training_job=launcher.job, rank=rank),
                scrape.value(
                    "stormwatch_train_step_duration_seconds_count",
                    training_job=launcher.job,
                    rank=rank,
                ),
                scrape.value("stormwatch_train_step", training_job=launcher.job, rank=rank),
            )
            for rank in ("0", "1")
        }
        # counter + histogram of each exited process folded, every attempt counted once
        expected = {(5.0 * (restarts + 1), float(restarts + 1), float(restarts))}
        # each running rank's three files (the count is as of the agent's last scan, which
        # may have listed the folder before the last attempt had made all of its files)
        files = scrape.value("stormwatch_agent_multiprocess_files", training_job=launcher.job)
        done = folded == 2 * 2 * restarts and per_rank == expected and files == 6
        return scrape if done else None

    tools.wait_for(settled, timeout=30)
    # the accumulator's few files aside, nothing of the exited processes is left
    files = list(metrics_dir.glob("*.db"))
    assert len(files) <= 6 + 4, sorted(p.name for p in files)


def _steps(tools: Any, agent: Any, job: str) -> float | None:
    return tools.scrape(agent.url).value("stormwatch_train_steps_total", training_job=job, rank="0")


def test_a_fresh_job_start_clears_the_jobs_series_while_an_elastic_restart_keeps_them(
    tmp_path: Path, fake_torchrun: Any, tools: Any, metrics_dir: Path
) -> None:
    """Same job name, same node folder: a restart within the job (another attempt, same
    instance) adds up; a new submission (another instance) starts again from its own
    values, also when the agent restarted in between (the instance is on disk)."""
    agent = tools.make_agent(tmp_path)
    try:
        first = fake_torchrun(
            [0],
            job="train",
            restart=True,
            env={"RESTARTS": "1", "STORMWATCH_JOB_INSTANCE": "submit-1"},
            rank_code=RESTARTING_RANK,
        )
        first.wait_pid(0, count=2)
        tools.wait_for(lambda: _steps(tools, agent, "train") == 10)  # attempt 0 + attempt 1
        tools.wait_for(
            lambda: tools.scrape(agent.url).value(
                "stormwatch_agent_multiprocess_folded_files_total"
            )
        )
        assert _steps(tools, agent, "train") == 10
        first.stop()
        tools.wait_for(lambda: not list(metrics_dir.glob("counter_[0-9]*.db")))
        assert _steps(tools, agent, "train") == 10  # all folded now: kept
    finally:
        agent.stop()
    recorded = json.loads((metrics_dir / INSTANCES_FILE).read_text())
    assert recorded["instances"] == {"train": "submit-1"}
    agent = tools.make_agent(tmp_path)
    try:
        assert _steps(tools, agent, "train") == 10
        second = fake_torchrun(
            [0],
            job="train",
            env={"RESTARTS": "0", "STORMWATCH_JOB_INSTANCE": "submit-2"},
            rank_code=RESTARTING_RANK,
        )
        second.wait_pid(0)
        tools.wait_for(lambda: _steps(tools, agent, "train") == 5)
        second.stop()
    finally:
        agent.stop()
    recorded = json.loads((metrics_dir / INSTANCES_FILE).read_text())
    assert recorded["instances"] == {"train": "submit-2"}


def test_agent_exports_its_folder_size_and_render_durations_which_promtool_accepts(
    start_agent: Any, fake_torchrun: Any, tools: Any
) -> None:
    agent = start_agent()
    launcher = fake_torchrun([0, 1])
    launcher.wait_pid(0)
    launcher.wait_pid(1)
    scrape = tools.wait_for(
        lambda: (
            (s := tools.scrape(agent.url)).value(
                "stormwatch_agent_multiprocess_files", training_job=launcher.job
            )
            == 6
            and s
        )
    )
    assert scrape.families["stormwatch_agent_multiprocess_files"] == "gauge"
    assert scrape.families["stormwatch_agent_multiprocess_folded_files_total"] == "counter"
    assert scrape.families["stormwatch_agent_render_duration_seconds"] == "histogram"
    count = scrape.value("stormwatch_agent_render_duration_seconds_count")
    assert count is not None and count >= 1
    assert scrape.value("stormwatch_agent_render_duration_seconds_bucket", le="+Inf") == count
    _, findings = tools.promtool_check_metrics(scrape.text)
    assert not [line for line in findings if line.startswith("stormwatch_agent_")], findings


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
def test_a_running_writer_in_its_own_pid_namespace_is_never_folded(
    start_agent: Any, tools: Any, metrics_dir: Path
) -> None:
    """A rank in a pod names its files by its pid in the pod's namespace, a pid no host
    process has: the agent must not take it for exited (its later writes would be lost)."""
    agent = start_agent()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    writer = shlex.join([sys.executable, "-c", WRITER, str(metrics_dir), "pod", "7", "stay", "-"])
    script = f"echo 3999990 > /proc/sys/kernel/ns_last_pid; {writer}"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    pid = json.loads(proc.stdout.readline())["pid"]
    try:
        assert pid > 3999990 and not psutil.pid_exists(pid)  # no host process has it
        tools.wait_for(
            lambda: tools.scrape(agent.url).value(
                "stormwatch_train_steps_total", training_job="pod", rank="0"
            )
        )
        scanned = agent.agent.watcher.last_scan_at
        tools.wait_for(lambda: (agent.agent.watcher.last_scan_at or 0) > (scanned or 0) + 0.5)
        assert (metrics_dir / f"counter_{pid}.db").exists()
        assert (
            tools.scrape(agent.url).value("stormwatch_agent_multiprocess_folded_files_total") == 0
        )
    finally:
        _finish(proc)
    tools.wait_for(
        lambda: (
            tools.scrape(agent.url).value("stormwatch_agent_multiprocess_folded_files_total") == 2
        )
    )
    assert (
        tools.scrape(agent.url).value("stormwatch_train_steps_total", training_job="pod", rank="0")
        == 20
    )


def test_a_folder_another_process_is_folding_is_left_to_it(metrics_dir: Path) -> None:
    """Two agents pointed at one folder must not both fold it (each would add the same
    exited files to its own accumulator): the second waits while the first holds the lock."""
    for seed in range(2):
        _write(metrics_dir, "j", seed, gauges=False)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(metrics_dir / LOCK)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    folder = TrainerFolder(metrics_dir)
    try:
        before = _samples(folder.merge())
        _maintain(folder)
        assert folder.folded_files == 0
        assert len(list(metrics_dir.glob("counter_[0-9]*.db"))) == 2
    finally:
        holder.communicate(timeout=30)
    _maintain(folder)
    assert folder.folded_files == 4
    assert _samples(folder.merge()) == before


HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()
    """
)


TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "rdzv"}


@pytest.mark.parametrize(
    ("extra", "instance"),
    [
        ({}, "rdzv"),  # torchrun's --rdzv-id: the same across restarts of the agent's group
        ({"SLURM_JOB_ID": "81"}, "81"),  # a requeue keeps the job id, the rendezvous may not
        ({"SLURM_JOB_ID": "81", "STORMWATCH_JOB_INSTANCE": "lab@1"}, "lab@1"),  # the launcher's
        ({"TORCHELASTIC_RESTART_COUNT": "3"}, "rdzv"),  # a restart is the same start
    ],
)
def test_a_ranks_job_instance_is_its_launchers_else_the_slurm_job_else_the_run_id(
    extra: dict[str, str], instance: str
) -> None:
    env = rank_env({**TORCHRUN_ENV, **extra})
    assert env is not None and env.instance == instance


def test_a_file_its_rank_never_sized_is_read_as_empty_and_folded_away(metrics_dir: Path) -> None:
    """A rank killed between creating a multiprocess file and prometheus-client sizing it
    (CI cc18: SIGTERM's default action ended a rank mid-flush) leaves a 0-byte file, on
    which the library's reader raises struct.error: the merge and the fold failed on every
    scrape and upkeep while it stayed."""
    folder = TrainerFolder(metrics_dir)
    wrote, _ = _write(metrics_dir, "j", 1)
    (metrics_dir / "counter_999999.db").touch()  # created, never sized: no header
    (metrics_dir / "histogram_999999.db").write_bytes(b"\x08\x00")  # cut inside the header
    before = _samples(folder.merge())
    key = ("stormwatch_train_steps_total", (("rank", "0"), ("training_job", "j")))
    assert before.get(key) == wrote["steps"]
    _maintain(folder)
    assert not (metrics_dir / "counter_999999.db").exists()
    assert _samples(folder.merge()).get(key) == wrote["steps"]
