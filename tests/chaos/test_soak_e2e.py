"""End to end: a SHORT soak (2 minutes) on a real lab through ``stormwatch chaos soak``: the
job checkpoints, pauses to evaluate, is restarted from a checkpoint, shrinks when a node leaves
and grows back when it rejoins, and no alert fires. Own names, subnet and ports.

The lab is the smallest that can resize a job: two nodes of one rank each (world size 2 -> 1
-> 2), without Slurm (the soak's job is elastic, which the lab starts itself, never through
Slurm's recipe; a Slurm cluster would only cost its daemons' CPU). The stages and the count
are tested on a stand-in lab in tests/chaos/test_soak_runner.py and test_soak_counting.py."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.chaos.soak.report import load_report
from stormwatch.lab import Lab, LabConfig

pytestmark = pytest.mark.e2e
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))

SOAK_LAB = LabConfig(
    prefix="swsoak",
    subnet=ipaddress.IPv4Network("10.223.0.0/24"),
    prometheus_port=29490,
    alertmanager_port=29493,
    responder_port=29495,
    rdzv_port=29710,
    nodes=2,
    nproc_per_node=1,
    slurm=False,
)
#: A step every ~0.4 s: a checkpoint every ~2 s, an evaluation pause of 8 s (past the faster
#: hang rules' few seconds) every ~12 s of training; the restart at 40 s, the resize at 80 s.
SOAK_ARGS = [
    "--minutes", "2", "--step-delay", "0.3", "--checkpoint-every", "5",
    "--eval-every", "30", "--eval-seconds", "8", "--settle-seconds", "20",
]  # fmt: skip


@pytest.mark.timeout(900)
def test_a_short_soak_restarts_resizes_and_fires_no_alert(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab creates network namespaces")
    run_dir = tmp_path / "run"
    lab = Lab(run_dir)
    try:
        lab.up(SOAK_LAB)
        out = subprocess.run(
            [STORMWATCH, "chaos", "soak", "--run-dir", str(run_dir), *SOAK_ARGS],
            capture_output=True,
            text=True,
            timeout=780,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        lab.down(SOAK_LAB)
    print(out.stdout, out.stderr)  # shown when the test fails
    (folder,) = (run_dir / "soaks").iterdir()
    report = load_report(folder / "soak.json")
    markdown = (folder / "soak.md").read_text()
    print(markdown)

    assert report.problems == [], report.problems
    assert not report.interrupted
    kinds = [e.kind for e in report.events if e.kind not in ("checkpoint", "eval")]
    assert kinds[:2] == ["start", "start"] and kinds[-1] == "end", kinds
    assert kinds.count("restart") == 3 and kinds.count("resize") == 5, kinds
    # The planned restart resumed from a checkpoint; the resize went 2 -> 1 -> 2.
    assert report.resumed_from[0] is None and report.resumed_from[1] is not None
    assert report.world_sizes[:2] == [2, 2] and report.world_sizes[-1] == 2, report.world_sizes
    assert 1 in report.world_sizes[2:], report.world_sizes
    assert len(report.of_kind("checkpoint")) >= 3
    # Evaluation pauses of ~8 s, as the phase gauge showed them (one cut short by a restart
    # of the workers, the resize's, is shorter).
    pauses = [e.seconds or 0 for e in report.of_kind("eval")]
    assert pauses and max(pauses) >= 6, pauses
    assert report.window_end is not None and report.window_end - report.window_start >= 120
    for heading in ("## What the soak did", "## Alerts that fired", "## Pending, never fired"):
        assert heading in markdown
    assert f"report: {folder / 'soak.md'}" in " ".join(out.stderr.split())

    # The target: no alert fired. Each one is named with the soak event nearest to it.
    fired = [
        f"{a.alertname} {a.labels} first firing {a.first_firing - report.started_at:.1f} s in, "
        f"nearest {a.nearest.kind if a.nearest else None} "
        f"{a.nearest.offset_seconds if a.nearest else 0:+.1f} s"
        for a in report.fired
    ]
    assert fired == [], fired
    assert report.verdict == "pass" and out.returncode == 0, out.stderr
