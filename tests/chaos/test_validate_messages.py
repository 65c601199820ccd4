"""What ``chaos validate`` says of a file, read as a fresh user reads it: the most useful
problem first, no problem said twice, counts in plain English, and comments in the shipped
experiment that claim only what validation checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stormwatch.chaos.errors import SelectionError
from stormwatch.chaos.experiment.selection import Shape
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


def test_a_misspelt_key_is_said_once_with_its_did_you_mean(tmp_path: Path) -> None:
    """It also said 'job.checkpoint_every: required field missing', first, for the same typo."""
    path = _kill_rank_with(tmp_path, "typo-field.yaml", checkpoint_every=None, checkpoint_evry=10)
    out = _validate(path)
    assert out.returncode == 2, out.stderr
    problems = out.stderr.splitlines()
    assert problems[0] == f"error: {path}: invalid experiment (1 problem)", out.stderr
    assert len(problems) == 2, out.stderr
    assert ": job.checkpoint_evry: unknown key 'checkpoint_evry' (did you mean " in problems[1]
    assert "required field missing" not in out.stderr


def test_a_misspelt_key_comes_before_other_problems_which_are_kept(tmp_path: Path) -> None:
    """A missing field that no misspelt key names is still reported, after the misspelling."""
    path = _kill_rank_with(
        tmp_path, "two.yaml", steps=None, checkpoint_every=None, checkpoint_evry=10
    )
    problems = _validate(path).stderr.splitlines()[1:]
    assert [p.split(": ", 2)[1] for p in problems] == ["job.checkpoint_evry", "job.steps"]
    assert problems[1].endswith("job.steps: required field missing (an integer)")


@pytest.mark.parametrize(
    ("world", "said"),
    [
        (1, "the job has 1 rank (job.world_size), so use 0"),
        (2, "the job has 2 ranks (job.world_size), so use 0-1"),
    ],
)
def test_a_rank_out_of_range_names_the_ranks_in_plain_english(
    tmp_path: Path, world: int, said: str
) -> None:
    """One rank was '1 ranks ..., so use 0-0'."""
    data = yaml.safe_load(REPO_EXPERIMENT.read_text())
    data["job"]["world_size"] = world
    data["method"][0]["fault"]["rank"] = world
    path = tmp_path / f"ws{world}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = _validate(path)
    assert out.returncode == 2
    assert out.stderr.rstrip().endswith(f"rank {world} is out of range: {said}"), out.stderr


def test_a_selected_rank_out_of_range_counts_one_rank_in_the_singular() -> None:
    with pytest.raises(SelectionError, match=r"the job has 1 rank \(0\)$"):
        Shape.generic(1, 1).check_rank(1)
    with pytest.raises(SelectionError, match=r"the job has 4 ranks \(0-3\)$"):
        Shape.generic(2, 2).check_rank(4)


def test_a_folder_is_validated_as_chaos_suite_reads_it(tmp_path: Path) -> None:
    """Fresh user: `validate experiments/suite` said "Is a directory" though `chaos suite`
    takes exactly that folder."""
    suite = tmp_path / "suite"
    suite.mkdir()
    _kill_rank_with(suite, "01-good.yaml")
    _kill_rank_with(suite, "02-bad.yaml", world_size=0)
    (suite / "notes.txt").write_text("not an experiment")
    done = _validate(suite)
    assert done.returncode == 2
    assert done.stdout.startswith(f"ok {suite / '01-good.yaml'}: "), done.stdout
    assert "02-bad.yaml" in done.stderr and "notes.txt" not in done.stdout + done.stderr


def test_an_empty_folder_is_a_problem_and_the_other_files_are_still_checked(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    good = _kill_rank_with(tmp_path, "good.yaml")
    done = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(good), str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout.startswith(f"ok {good}: ")
    assert f"{empty}: no *.yaml or *.yml file in this folder" in done.stderr
    assert "suite" not in done.stderr
