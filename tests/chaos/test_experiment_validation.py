"""Experiment files: every invalid one is rejected before anything starts, naming file, field, allowed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stormwatch.chaos import InvalidExperiment, load_experiment
from stormwatch.chaos.gameday.demo import PACKAGED_EXPERIMENT, REPO_EXPERIMENT, demo_experiment
from stormwatch.errors import ConfigError

STORMWATCH = Path(sys.executable).with_name("stormwatch")
KILL_RANK = REPO_EXPERIMENT

GOOD = """
version: 1
title: t
job: {steps: 50, checkpoint_every: 10}
steady_state_hypothesis:
  title: h
  probes:
    - name: p
      provider: {type: prometheus, query: 'up{job="${job}"}', tolerance: 1}
method:
  - type: action
    name: kill
    when: {step: 25}
    fault: {kind: kill_rank, rank: 1, signal: SIGKILL, ttl_seconds: 60}
rollbacks:
  - {type: revert, name: undo}
"""


def _mutate(path: str, value: object, *, delete: bool = False) -> str:
    """GOOD with the value at dotted ``path`` (``method.0.fault.rank``) replaced or deleted."""
    data = yaml.safe_load(GOOD)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: int | str = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]
    else:
        node[key] = value
    return yaml.safe_dump(data)


#: The line of ``rank: -1`` in ``_mutate("method.0.fault.rank", -1)``: errors name it.
RANK_LINE = next(
    number
    for number, line in enumerate(_mutate("method.0.fault.rank", -1).splitlines(), 1)
    if "rank: -1" in line
)


# (case id, file text, field path the message must name, what it must say is allowed)
BAD = [
    (
        "negative-rank",
        _mutate("method.0.fault.rank", -1),
        "method[0].fault.rank",
        "greater than or equal to 0",
    ),
    (
        "rank-as-string",
        _mutate("method.0.fault.rank", "1"),
        "method[0].fault.rank",
        "valid integer",
    ),
    (
        "bad-signal",
        _mutate("method.0.fault.signal", "SIGHUP"),
        "method[0].fault.signal",
        "'SIGKILL' or 'SIGTERM'",
    ),
    (
        "unknown-fault-kind",
        _mutate("method.0.fault.kind", "reboot_node"),
        "method[0].fault.kind",
        "'kill_rank', 'freeze_rank'",
    ),
    (
        "missing-fault-kind",
        _mutate("method.0.fault.kind", None, delete=True),
        "method[0].fault.kind",
        "'kill_rank', 'freeze_rank'",
    ),
    (
        "unknown-fault-key",
        _mutate("method.0.fault.node", "node0"),
        "method[0].fault.node",
        "valid keys: kind, rank, signal, ttl_seconds",
    ),
    ("unknown-top-key", _mutate("not_a_field", 3), "not_a_field", "valid keys: version, title"),
    (
        "unknown-activity-type",
        _mutate("method.0.type", "explode"),
        "method[0].type",
        "'action', 'probe', 'pause'",
    ),
    (
        "rollback-cannot-inject",
        _mutate("rollbacks.0.type", "action"),
        "rollbacks[0].type",
        "'revert', 'probe', 'pause'",
    ),
    (
        "zero-ttl",
        _mutate("method.0.fault.ttl_seconds", 0),
        "method[0].fault.ttl_seconds",
        "greater than 0",
    ),
    (
        "ttl-over-a-day",
        _mutate("method.0.fault.ttl_seconds", 100000),
        "method[0].fault.ttl_seconds",
        "less than or equal to 86400",
    ),
    (
        "step-after-job-end",
        _mutate("method.0.when.step", 50),
        "method[0].when.step",
        "must be < job.steps (50)",
    ),
    (
        "step-zero",
        _mutate("method.0.when.step", 0),
        "method[0].when.step",
        "greater than or equal to 1",
    ),
    ("missing-steps", _mutate("job.steps", None, delete=True), "job.steps", "required"),
    ("steps-float", _mutate("job.steps", 50.5), "job.steps", "valid integer"),
    (
        "wrong-version",
        _mutate("version", 2),
        "version",
        "this stormwatch reads version 1 only, not 2: write the file for version 1",
    ),
    (
        "missing-version",
        _mutate("version", None, delete=True),
        "version",
        "missing; this stormwatch reads version 1: add `version: 1`",
    ),
    ("version-a-string", _mutate("version", "1"), "version", "must be the number 1 (got '1')"),
    (  # a version that never was: no "use a stormwatch that reads version 0" (breaker pass)
        "version-zero",
        _mutate("version", 0),
        "version",
        "this stormwatch reads version 1 only, not 0: write the file for version 1 (`version: 1`)",
    ),
    ("empty-method", _mutate("method", []), "method", "at least 1 item"),
    (
        "no-probes",
        _mutate("steady_state_hypothesis.probes", []),
        "steady_state_hypothesis.probes",
        "at least 1 item",
    ),
    (
        "unknown-provider",
        _mutate("steady_state_hypothesis.probes.0.provider.type", "smoke-signal"),
        "steady_state_hypothesis.probes[0].provider.type",
        "'prometheus', 'job', 'http', 'ranks', 'progress', 'loss'",
    ),
    (
        "two-tolerances",
        _mutate("steady_state_hypothesis.probes.0.provider.tolerance", {"eq": 1, "gt": 0}),
        "steady_state_hypothesis.probes[0].provider.tolerance",
        "exactly one of eq, ne, gt",
    ),
    (
        "inverted-range",
        _mutate("steady_state_hypothesis.probes.0.provider.tolerance", {"range": [5, 1]}),
        "steady_state_hypothesis.probes[0].provider.tolerance",
        "low <= high",
    ),
    (
        "tolerance-bool",
        _mutate("steady_state_hypothesis.probes.0.provider.tolerance", True),
        "steady_state_hypothesis.probes[0].provider.tolerance",
        "exactly one of",
    ),
    (
        "unknown-placeholder",
        _mutate("steady_state_hypothesis.probes.0.provider.query", 'up{job="${jobname}"}'),
        "steady_state_hypothesis.probes[0].provider.query",
        "${job}, ${steps}",
    ),
    (
        "bad-phase",
        _mutate("steady_state_hypothesis.probes.0.phases", ["during"]),
        "steady_state_hypothesis.probes[0].phases[0]",
        "'before' or 'after'",
    ),
    (
        "bad-job-expectation",
        _mutate("steady_state_hypothesis.probes.0.provider", {"type": "job", "expect": "happy"}),
        "steady_state_hypothesis.probes[0].provider.expect",
        "'progressing' or 'finished'",
    ),
    (
        "bad-rollback-strategy",
        _mutate("rollback_strategy", "sometimes"),
        "rollback_strategy",
        "'always', 'default', 'deviated' or 'never'",
    ),
    (
        "duplicate-names",
        _mutate("rollbacks.0.name", "kill"),
        "rollbacks[0].name",
        "names must be unique",
    ),
    ("bad-name", _mutate("method.0.name", "kill rank!"), "method[0].name", "should match pattern"),
    ("bad-job-name", _mutate("job.name", "Bad Name"), "job.name", "should match pattern"),
    (
        "misspelt-key",
        _mutate("job.checkpoint_evry", 10),
        "job.checkpoint_evry",
        "unknown key 'checkpoint_evry' (did you mean 'checkpoint_every'? valid keys: name,",
    ),
    (
        "command-placeholder",
        _mutate("job.command", ["python", "train.py", "--steps=${step}"]),
        "job.command",
        "unknown placeholder(s) ['step'] (allowed: ${job}, ${steps}",
    ),
    ("empty-command", _mutate("job.command", []), "job.command", "at least 1 item"),
    (
        "elastic-command",
        _mutate("job", {"steps": 5, "checkpoint_every": 1, "min_nodes": 1, "command": ["x"]}),
        "job",
        "min_nodes shapes the reference trainer (stormwatch train); a job.command runs its own",
    ),
    (
        "duplicate-yaml-key",
        GOOD.replace("title: t\n", "title: t\ntitle: u\n"),
        "",
        "duplicate key 'title'",
    ),
    ("not-yaml", "version: 1\ntitle: [unclosed\n", "", "not valid YAML"),
    ("not-a-mapping", "- 1\n- 2\n", "", "must be a mapping with keys version, title"),
    ("empty-file", "", "", "(got empty)"),
]


@pytest.mark.parametrize(
    ("text", "field", "allowed"), [c[1:] for c in BAD], ids=[c[0] for c in BAD]
)
def test_invalid_experiment_names_file_field_and_what_is_allowed(
    tmp_path: Path, text: str, field: str, allowed: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)

    with pytest.raises(InvalidExperiment) as caught:
        load_experiment(path)

    assert isinstance(caught.value, ConfigError)
    lines = str(caught.value).splitlines()
    expected = re.escape(str(path)) + r"(:\d+)?: " + (re.escape(field) + ": " if field else "")
    matching = [line for line in lines[1:] if re.match(expected, line)]
    assert matching, f"no line names {expected!r}:\n{caught.value}"
    assert any(allowed in line for line in matching), f"{allowed!r} not said:\n{caught.value}"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    text = _mutate("method.0.fault.rank", -1).replace("title: t", "title: t\nbogus: 1")
    path.write_text(text)
    with pytest.raises(InvalidExperiment) as caught:
        load_experiment(path)
    assert {i.path for i in caught.value.issues} == {"method[0].fault.rank", "bogus"}


def test_missing_file_is_an_invalid_experiment(tmp_path: Path) -> None:
    with pytest.raises(InvalidExperiment, match="cannot read the file"):
        load_experiment(tmp_path / "nope.yaml")


def test_shipped_kill_rank_experiment_is_valid_and_kills_off_a_checkpoint_step() -> None:
    experiment = load_experiment(KILL_RANK)
    action = experiment.method[0]
    assert action.type == "action" and action.fault.kind == "kill_rank"
    assert action.fault.rank == 1 and action.fault.signal == "SIGKILL"
    assert action.when is not None
    assert action.when.step % experiment.job.checkpoint_every != 0, "no steps would be lost"
    assert experiment.rollback_strategy == "always"


def test_packaged_copy_of_the_demo_experiment_is_the_shipped_file() -> None:
    assert PACKAGED_EXPERIMENT.read_bytes() == KILL_RANK.read_bytes()


def test_demo_steps_override_is_revalidated() -> None:
    assert demo_experiment(KILL_RANK, 60).job.steps == 60
    with pytest.raises(InvalidExperiment, match=r"method\[0\]\.when\.step: must be < job.steps"):
        demo_experiment(KILL_RANK, 20)
    with pytest.raises(InvalidExperiment, match=r"\(job.steps 20 is the demo's --steps; the file"):
        demo_experiment(KILL_RANK, 20)  # the user's flag caused it, not the file


def test_validate_command_accepts_good_and_rejects_bad(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_mutate("method.0.fault.rank", -1))
    good = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(KILL_RANK)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    both = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(KILL_RANK), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert good.returncode == 0 and "ok" in good.stdout
    assert both.returncode == 2
    assert (
        f"{bad}:{RANK_LINE}: method[0].fault.rank" in both.stderr and "Traceback" not in both.stderr
    )


def test_validate_says_in_plain_words_which_version_it_reads(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    missing.write_text(_mutate("version", None, delete=True))
    out = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[1:] == [
        f"{missing}: version: missing; this stormwatch reads version 1: add `version: 1`"
    ]


def test_run_with_invalid_experiment_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_mutate("method.0.fault.rank", -1))
    run_dir = tmp_path / "run"

    out = subprocess.run(
        [str(STORMWATCH), "chaos", "run", str(bad), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert (
        f"{bad}:{RANK_LINE}: method[0].fault.rank: Input should be greater than or equal to 0"
        in out.stderr
    )
    # Nothing touched: no run directory (so no lab, no ledger, no journal), no children left.
    assert not run_dir.exists()


def test_run_without_a_lab_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [str(STORMWATCH), "chaos", "run", str(KILL_RANK), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "no lab" in out.stderr and "stormwatch lab up" in out.stderr
    assert not (run_dir / "chaos").exists() and not (run_dir / "experiments").exists()


def test_validate_rejects_a_rank_outside_the_fixed_world_size(tmp_path: Path) -> None:
    bad = tmp_path / "rank9.yaml"
    data = yaml.safe_load(_mutate("method.0.fault.rank", 9))
    data["job"]["world_size"] = 4
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(
        InvalidExperiment,
        match=r"method\[0\]\.fault\.rank: rank 9 is out of range: the job has 4 ranks "
        r"\(job\.world_size\), so use 0-3",
    ):
        load_experiment(bad)

    data["job"].pop("world_size")
    data["job"].update(nodes=2, nproc_per_node=2)
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidExperiment, match=r"job\.nodes \* job\.nproc_per_node = 2 \* 2"):
        load_experiment(bad)

    data["job"].update(world_size=8)
    data["method"][0]["fault"]["rank"] = 1
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidExperiment, match=r"job\.world_size: 8 != job\.nodes"):
        load_experiment(bad)

    out = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(KILL_RANK)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The shipped experiment fixes 4 ranks; the summary counts in words, singular included.
    assert load_experiment(KILL_RANK).job.fixed_world_size == 4
    assert "(2 method activities, 1 rollback)" in out.stdout, out.stdout


def test_chaos_commands_take_the_run_dir_from_stormwatch_lab_dir(tmp_path: Path) -> None:
    env_dir = tmp_path / "elsewhere"
    (tmp_path / "run" / "demo" / "chaos").mkdir(parents=True)
    (tmp_path / "run" / "demo" / "chaos" / "ledger.sqlite3").write_bytes(b"")
    with_env = subprocess.run(
        [str(STORMWATCH), "chaos", "ledger"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "STORMWATCH_LAB_DIR": str(env_dir)},
    )
    assert with_env.returncode == 1, with_env.stderr
    assert f"no fault ledger at {env_dir}/chaos/ledger.sqlite3" in with_env.stderr

    # Default run dir without a ledger, but the demo has one: say where it is.
    default = subprocess.run(
        [str(STORMWATCH), "chaos", "ledger"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "STORMWATCH_LAB_DIR"},
    )
    assert default.returncode == 1
    assert "`stormwatch chaos ledger --run-dir run/demo`" in " ".join(default.stderr.split())

    for command in ("run", "revert", "ledger", "postmortem"):
        help_text = subprocess.run(
            [str(STORMWATCH), "chaos", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "STORMWATCH_LAB_DIR" in help_text, command


def _yaml_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        previous = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{previous}]")
    return "\n".join(lines) + f"\ntags: *a{levels}\n"


@pytest.mark.parametrize(
    ("content", "wanted"),
    [
        # Nine levels of aliases: validate reached 1.7 GB RSS before it was refused.
        (_yaml_bomb().encode(), "anchors and aliases"),
        (b"title: x\ntags: [a, b]\nextra: &x 1\n", "anchors and aliases (&name, *name)"),
        (b"title: caf\xe9\n", "not UTF-8 text (byte 10, line 1)"),
        (b"[" * 100_000, "nested too deeply"),
        (b"# padding\n" * 110_000, "larger than 1024 KiB"),
    ],
    ids=["alias-bomb", "anchor", "latin1", "deep-nesting", "too-large"],
)
def test_hostile_yaml_is_refused_fast_without_traceback(
    tmp_path: Path, content: bytes, wanted: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    with pytest.raises(InvalidExperiment, match=re.escape(wanted)):
        load_experiment(bad)
    out = subprocess.run(
        [str(STORMWATCH), "chaos", "validate", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert str(bad) in out.stderr and wanted in out.stderr
    assert "Traceback" not in out.stderr


def test_an_alias_is_refused_naming_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "alias.yaml"
    bad.write_text("title: x\nbase: &b {a: 1}\n")
    with pytest.raises(InvalidExperiment, match=r"at line 2, column 7"):
        load_experiment(bad)


def test_a_version_below_1_is_not_offered_a_stormwatch_that_reads_it() -> None:
    from pydantic import ValidationError

    from stormwatch.chaos.experiment.model import Experiment

    for version, offered in ((0, False), (-1, False), (2, True)):
        with pytest.raises(ValidationError) as caught:
            Experiment.model_validate({"version": version})
        assert ("use a stormwatch that reads" in str(caught.value)) is offered, version
