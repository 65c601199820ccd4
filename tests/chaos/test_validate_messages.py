"""What ``chaos validate`` says of a file, read as a fresh user reads it, and comments in
the shipped experiment that claim only what validation checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from stormwatch.chaos.gameday.demo import REPO_EXPERIMENT

STORMWATCH = Path(sys.executable).with_name("stormwatch")


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _kill_rank_with(tmp_path: Path, name: str, **job: object) -> Path:
    """The shipped kill-rank experiment with its job section's keys set (None: removed)."""
    data = yaml.safe_load(REPO_EXPERIMENT.read_text())
    for key, value in job.items():
        if value is None:
            del data["job"][key]
        else:
            data["job"][key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_kill_rank_world_size_comment_claims_only_what_validate_checks(
    tmp_path: Path,
) -> None:
    """validate checks the fault's rank against job.world_size, not a target's nodes x
    workers (3 and 5 ranks pass): the comment said '2 nodes x 2 workers: ranks 0-3 (checked
    by `chaos validate`)'."""
    lines = REPO_EXPERIMENT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  world_size: 4"))
    comment = [lines[start].split("#", 1)[1]]
    comment += [line.split("#", 1)[1] for line in lines[start + 1 :] if line.strip()[:1] == "#"][:2]
    words = " ".join(" ".join(comment).split())
    assert "checked by `chaos validate`" not in words
    assert "`chaos validate` checks the fault's rank against it" in words, words
    assert "the run checks it against the target's nodes x workers" in words, words
    for world in (3, 5):
        out = _validate(_kill_rank_with(tmp_path, f"ws{world}.yaml", world_size=world))
        assert out.returncode == 0 and out.stdout.startswith("ok "), out.stderr
