"""Shared helpers for the trainer's tests (torchrun end-to-end runs: real torchrun, gloo, CPU).

``torchrun_train(root, args, ...)`` runs ``stormwatch train *args`` under
torchrun with ``--checkpoint-dir/--log-dir/--metrics-dir`` inside ``root`` and
returns a :class:`TorchrunRun` (events per rank, losses per step, metrics); its
``control`` arms fault points before the job starts. ``arm_control(dir, rank,
*entries)`` writes a rank's control file (``stormwatch.faults.control_file``): the
one channel through which fault points reach the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.faults.control_file import control_path
from stormwatch.telemetry.events import RankEvent, read_events

#: Metric samples keyed by (name, sorted label pairs).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class TorchrunRun:
    """One finished torchrun job of ``stormwatch train``."""

    root: Path
    returncode: int
    output: str
    seconds: float

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def checkpoints(self) -> Path:
        return self.root / "ckpt"

    def events(self, rank: int) -> list[RankEvent]:
        return read_events(self.logs / f"rank{rank}.jsonl")

    def losses(self, rank: int) -> dict[int, set[str]]:
        """step -> every loss_hex logged for it (one per attempt that ran the step)."""
        out: dict[int, set[str]] = {}
        for event in self.events(rank):
            if event.event == "step":
                out.setdefault(event.step, set()).add(event.loss_hex)
        return out

    def samples(self) -> Samples:
        """Every metric sample the ranks wrote (prometheus-client multiprocess files)."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.metrics))
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect()
            for s in family.samples
        }


def stormwatch_binary() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


def arm_control(control_dir: Path, rank: int, *entries: Mapping[str, object]) -> Path:
    """Write ``entries`` as rank ``rank``'s control file ``<control_dir>/rank<rank>.json``,
    atomically, as the agent and the platforms do (entries as given: a test may write one
    the trainer must refuse). A rewrite within one mtime tick still counts: the mtime is
    moved on by a millisecond.

    Returns:
        The file's path.
    """
    path = control_path(control_dir, rank)
    control_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": [dict(e) for e in entries]}))
    os.replace(tmp, path)
    stamp = path.stat().st_mtime_ns + 1_000_000
    os.utime(path, ns=(stamp, stamp))
    return path


@pytest.fixture(scope="session")
def arm_control_file() -> Callable[..., Path]:
    """:func:`arm_control`, for tests that arm fault points themselves."""
    return arm_control


def torchrun_command(
    root: Path,
    train_args: Sequence[str],
    *,
    nproc: int,
    extra_env: dict[str, str] | None = None,
    max_restarts: int = 0,
    control: Mapping[int, Sequence[Mapping[str, object]]] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of :func:`run_torchrun` (``control`` written now)."""
    root.mkdir(parents=True, exist_ok=True)
    for rank, entries in (control or {}).items():
        arm_control(root / "metrics" / "control", rank, *entries)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env.update({"OMP_NUM_THREADS": "1", **(extra_env or {})})
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
        "--no-python", stormwatch_binary(), "train", *train_args,
        "--checkpoint-dir", str(root / "ckpt"),
        "--log-dir", str(root / "logs"),
        "--metrics-dir", str(root / "metrics"),
    ]  # fmt: skip
    return command, env


def run_torchrun(
    root: Path,
    train_args: Sequence[str],
    *,
    nproc: int,
    extra_env: dict[str, str] | None = None,
    max_restarts: int = 0,
    control: Mapping[int, Sequence[Mapping[str, object]]] | None = None,
    on_poll: Callable[[], None] | None = None,
) -> TorchrunRun:
    """Run ``stormwatch train *train_args`` on ``nproc`` local CPU ranks under torchrun.

    ``control`` (rank -> entries) is written to ``<root>/metrics/control`` (the trainer's
    default control folder) before torchrun starts, so it holds from step 1. ``on_poll``
    is called every 0.1 s while the job runs, and once after it ended (to read what a
    restarted rank overwrites, e.g. its dump).
    """
    command, env = torchrun_command(
        root,
        train_args,
        nproc=nproc,
        extra_env=extra_env,
        max_restarts=max_restarts,
        control=control,
    )
    started = time.monotonic()
    if on_poll is None:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=root
        )
        output, code = done.stdout + done.stderr, done.returncode
    else:
        with subprocess.Popen(
            command, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ) as proc:
            chunks: list[bytes] = []
            stdout = proc.stdout
            assert stdout is not None
            reader = threading.Thread(target=lambda: chunks.append(stdout.read()))
            reader.start()  # the pipe must not fill up while we poll
            while proc.poll() is None and time.monotonic() - started < 300:
                on_poll()
                time.sleep(0.1)
            proc.kill()
            reader.join(10)
            code = proc.wait()
        on_poll()
        output = b"".join(chunks).decode(errors="replace")
    return TorchrunRun(root, code, output, time.monotonic() - started)


@pytest.fixture(scope="session")
def torchrun_train() -> Callable[..., TorchrunRun]:
    """:func:`run_torchrun`, for module-scoped fixtures of the e2e tests."""
    return run_torchrun


@pytest.fixture
def one_rank_group() -> Iterator[object]:
    """A one-rank gloo process group (in-memory store) for the test; yields the WORLD group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
