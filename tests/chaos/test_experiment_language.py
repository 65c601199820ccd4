"""The experiment language: targets, blast radius, until, background faults, safeguards, probes,
dry-run; malformed files (generated) each give a clear error naming file, line and field."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormwatch.chaos import InvalidExperiment, load_experiment, parse_experiment
from stormwatch.chaos.errors import SelectionError
from stormwatch.chaos.experiment.model import ActionActivity, TargetSelector
from stormwatch.chaos.experiment.selection import (
    Shape,
    allowed_ranks,
    expand,
    select_ranks,
    touched_ranks,
)

STORMWATCH = Path(sys.executable).with_name("stormwatch")


@pytest.fixture
def stormwatch(
    stormwatch: Callable[..., subprocess.CompletedProcess[str]], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The in-process CLI (tests/conftest.py) with no STORMWATCH_* settings and a
    200-column terminal: for the cases about what a command says; one dry run below is a
    real process."""
    for name in [n for n in os.environ if n.startswith("STORMWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")

    return stormwatch


#: Every new part of the language in one valid file (2 nodes x 2 ranks).
RICH = """
version: 1
title: rich
job: {steps: 50, checkpoint_every: 10, nodes: 2, nproc_per_node: 2}
steady_state_hypothesis:
  title: h
  probes:
    - name: prom
      provider: {type: prometheus, query: 'up{job="${job}"}', tolerance: {ge: 1}}
    - name: http
      provider: {type: http, url: 'http://127.0.0.1:1/healthz', status: 200}
    - name: ranks
      provider: {type: ranks, tolerance: 4}
    - name: progress
      provider: {type: progress, min_steps: 2, window_seconds: 20}
    - name: loss
      provider: {type: loss, max: 20.0, max_ratio: 2.0}
method:
  - type: action
    name: slow-some
    target: {role: worker, random: {k: 1, seed: 7}}
    fault: {kind: trainer_fault, point: slow_step, seconds: 0.5, ttl_seconds: 30}
    background: true
  - type: until
    name: straggler-fires
    query: 'count(ALERTS{alertname="StormwatchStraggler"})'
    tolerance: {ge: 1}
    timeout_seconds: 60
  - {type: pause, name: hold, seconds: 1}
rollbacks:
  - {type: revert, name: undo}
safeguards:
  - name: loss-sane
    provider: {type: loss, max_ratio: 3.0}
    interval_seconds: 1
blast_radius: {max_fraction_of_ranks: 0.5}
expect: {alerts: [StormwatchStraggler], loss: skip}
"""


def _mutate(path: str, value: object, *, delete: bool = False) -> str:
    data = yaml.safe_load(RICH)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: int | str = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]
    else:
        node[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def test_the_rich_experiment_is_valid() -> None:
    experiment = parse_experiment(RICH)
    action = experiment.method[0]
    assert isinstance(action, ActionActivity) and action.background
    assert experiment.safeguards[0].name == "loss-sane"
    assert experiment.expect.loss == "skip"


# (case id, text, field path, what the message must say)
BAD = [
    (
        "target-two-pools",
        _mutate("method.0.target", {"role": "worker", "node": "sw-node1"}),
        "method[0].target",
        "at most one of node, ranks, role",
    ),
    (
        "random-k-and-percent",
        _mutate("method.0.target", {"random": {"k": 1, "percent": 50}}),
        "method[0].target.random",
        "exactly one of 'k'",
    ),
    (
        "unknown-role",
        _mutate("method.0.target", {"role": "boss"}),
        "method[0].target.role",
        "'leader', 'rdzv_host', 'worker' or 'any'",
    ),
    (
        "target-and-fault-rank",
        _mutate(
            "method.0.fault",
            {"kind": "trainer_fault", "rank": 1, "point": "slow_step", "seconds": 1.0},
        ),
        "method[0]",
        "either in 'target' or as the fault's rank",
    ),
    (
        "target-rank-out-of-range",
        _mutate("method.0.target", {"ranks": [1, 9]}),
        "method[0].target",
        "rank 9 is out of range",
    ),
    (
        "target-unknown-node",
        _mutate("method.0.target", {"node": "sw-node7"}),
        "method[0].target",
        "no node 'sw-node7'",
    ),
    (
        "target-random-k-above-the-pool",
        _mutate("method.0.target", {"role": "worker", "random": {"k": 5}}),
        "method[0].target",
        "random.k 5 is more than the 3 rank(s) to pick from",
    ),
    (
        "target-on-a-partition",
        _mutate(
            "method.0",
            {
                "type": "action",
                "name": "cut",
                "target": {"node": "sw-node1"},
                "fault": {"kind": "partition"},
            },
        ),
        "method[0]",
        "fault kind 'partition' takes no 'target' (it names its nodes in 'nodes')",
    ),
    (
        "target-on-kill-rdzv-host",
        _mutate(
            "method.0",
            {
                "type": "action",
                "name": "cut",
                "target": {"role": "leader"},
                "fault": {"kind": "kill_rdzv_host"},
            },
        ),
        "method[0]",
        "fault kind 'kill_rdzv_host' takes no 'target'",
    ),
    (
        "blast-radius-exceeded",
        _mutate("method.0.target", {"role": "any"}),
        "blast_radius.max_fraction_of_ranks",
        "touch 4 of 4 ranks",
    ),
    (
        "blast-radius-above-one",
        _mutate("blast_radius", {"max_fraction_of_ranks": 1.5}),
        "blast_radius.max_fraction_of_ranks",
        "less than or equal to 1",
    ),
    (
        "until-without-tolerance",
        _mutate("method.1.tolerance", None, delete=True),
        "method[1].tolerance",
        "required",
    ),
    (
        "until-unknown-placeholder",
        _mutate("method.1.query", "up{job='${jobb}'}"),
        "method[1].query",
        "unknown placeholder(s) ['jobb']",
    ),
    (
        "until-not-promql",
        _mutate("method.1.query", "count(ALERTS{"),
        "method[1].query",
        "not valid PromQL: unexpected end of input inside braces",
    ),
    (
        "until-bad-duration",
        _mutate("method.1.query", "rate(up{job='${job}'}[5x]) > ${world_size}"),
        "method[1].query",
        "not valid PromQL: bad number or duration syntax: 5x",
    ),
    (
        "elastic-min-nodes-above-nodes",
        _mutate("job.min_nodes", 3),
        "job",
        "min_nodes (3) is more than nodes (2)",
    ),
    (
        "probe-not-promql",
        _mutate("steady_state_hypothesis.probes.0.provider.query", "sum by (rank up)"),
        "steady_state_hypothesis.probes[0].provider.query",
        "not valid PromQL",
    ),
    (
        "safeguard-unknown-provider",
        _mutate("safeguards.0.provider", {"type": "vibes"}),
        "safeguards[0].provider.type",
        "'prometheus', 'job', 'http', 'ranks', 'progress', 'loss'",
    ),
    (
        "safeguard-unknown-key",
        _mutate("safeguards.0.every", 3),
        "safeguards[0].every",
        "valid keys: name, provider, interval_seconds",
    ),
    (
        "http-not-a-url",
        _mutate("steady_state_hypothesis.probes.1.provider.url", "localhost:80"),
        "steady_state_hypothesis.probes[1].provider.url",
        "should match pattern",
    ),
    (
        "ranks-tolerance-wrong-type",
        _mutate("steady_state_hypothesis.probes.2.provider.tolerance", "four"),
        "steady_state_hypothesis.probes[2].provider.tolerance",
        "must be a number",
    ),
    (
        "expect-loss-unknown",
        _mutate("expect", {"loss": "close-enough"}),
        "expect.loss",
        "'identical', 'bounded' or 'skip'",
    ),
    (
        "background-not-bool",
        _mutate("method.0.background", "yes please"),
        "method[0].background",
        "valid boolean",
    ),
]


@pytest.mark.parametrize(("text", "field", "said"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_each_mistake_is_one_clear_error_naming_file_line_and_field(
    tmp_path: Path, text: str, field: str, said: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidExperiment) as caught:
        load_experiment(path)
    lines = str(caught.value).splitlines()[1:]
    pattern = re.escape(str(path)) + r":(\d+): " + re.escape(field) + ": "
    named = [line for line in lines if re.match(pattern, line)]
    assert named, f"no line names {field!r} with a line number:\n{caught.value}"
    assert any(said in line for line in named), f"{said!r} not said:\n{caught.value}"
    assert len(caught.value.issues) == 1, caught.value


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, (*path, i))]
    return [path]


def _mappings(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if isinstance(node, dict) else []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else []
    )
    for key, value in children:
        found += _mappings(value, (*path, key))
    return found


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


#: A value of the wrong type for every kind of leaf (a mapping where a scalar is wanted,
#: a list where a string is wanted, ...).
def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return {"not": "a bool"}
    if isinstance(value, (int, float)):
        return [value]
    return {"not": "a string"}


def test_generated_wrong_types_each_name_their_field_and_line() -> None:
    base = yaml.safe_load(RICH)
    checked = 0
    for leaf in _leaves(base):
        data = yaml.safe_load(RICH)
        parent = _at(data, leaf[:-1])
        parent[leaf[-1]] = _wrong(parent[leaf[-1]])
        with pytest.raises(InvalidExperiment) as caught:
            parse_experiment(yaml.safe_dump(data, sort_keys=False), "gen.yaml")
        field = _dotted(leaf)
        issues = caught.value.issues
        near = [i for i in issues if i.path.startswith(field) or field.startswith(i.path)]
        assert near, f"{field}: no issue names it: {caught.value}"
        assert all(i.line is not None for i in near), f"{field}: no line: {caught.value}"
        checked += 1
    assert checked > 40


def test_generated_unknown_keys_are_rejected_listing_the_valid_ones() -> None:
    base = yaml.safe_load(RICH)
    for mapping in _mappings(base):
        data = yaml.safe_load(RICH)
        _at(data, mapping)["zz_unknown"] = 1
        with pytest.raises(InvalidExperiment) as caught:
            parse_experiment(yaml.safe_dump(data, sort_keys=False), "gen.yaml")
        field = _dotted((*mapping, "zz_unknown"))
        [issue] = [i for i in caught.value.issues if i.path == field] or [None]
        assert issue is not None, f"{field} not named: {caught.value}"
        assert "unknown key 'zz_unknown'" in issue.message
        assert "valid keys:" in issue.message
        assert issue.line is not None


@pytest.mark.parametrize(
    ("content", "wanted"),
    [
        (b"", "(got empty)"),
        (b"   \n# only a comment\n", "(got empty)"),
        (b"version: 1\n" + b"x" * (1024 * 1024), "larger than 1024 KiB"),
        (b"method: [1, 2\n", "not valid YAML"),
    ],
    ids=["empty", "comment-only", "huge", "truncated"],
)
def test_empty_huge_and_broken_files_start_nothing(
    tmp_path: Path, content: bytes, wanted: str, stormwatch
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    run_dir = tmp_path / "run"
    out = stormwatch("chaos", "run", str(bad), "--run-dir", str(run_dir))
    assert out.returncode == 2, out.stderr
    assert wanted in out.stderr and str(bad) in out.stderr
    assert "Traceback" not in out.stderr
    assert not run_dir.exists(), "nothing may be started or written"


# -- targets and blast radius -------------------------------------------------------------------

SHAPE = Shape(("sw-node0", "sw-node1"), 2)


def test_selectors_pick_by_node_rank_role_and_seeded_random() -> None:
    assert select_ranks(TargetSelector(node="sw-node1"), SHAPE) == [2, 3]
    assert select_ranks(TargetSelector(node="swchaos-node1"), SHAPE) == [2, 3]  # by index
    assert select_ranks(TargetSelector(ranks=[3, 1, 3]), SHAPE) == [1, 3]
    assert select_ranks(TargetSelector(role="leader"), SHAPE) == [0]
    assert select_ranks(TargetSelector(role="rdzv_host"), SHAPE) == [0, 1]
    assert select_ranks(TargetSelector(role="worker"), SHAPE) == [1, 2, 3]
    pick = TargetSelector.model_validate({"random": {"k": 2, "seed": 3}})
    assert select_ranks(pick, SHAPE) == select_ranks(pick, SHAPE)  # same seed, same pick
    assert len(select_ranks(pick, SHAPE)) == 2
    seeds = {
        tuple(select_ranks(TargetSelector.model_validate({"random": {"k": 2, "seed": s}}), SHAPE))
        for s in range(20)
    }
    assert len(seeds) > 1, "different seeds pick different ranks"
    quarter = TargetSelector.model_validate({"role": "any", "random": {"percent": 25, "seed": 0}})
    assert len(select_ranks(quarter, SHAPE)) == 1
    with pytest.raises(SelectionError, match="no node 'gpu-box'"):
        select_ranks(TargetSelector(node="gpu-box"), SHAPE)


def test_a_node_fault_with_a_target_is_one_fault_per_node() -> None:
    data = yaml.safe_load(RICH)
    data["method"][0] = {
        "type": "action",
        "name": "xid",
        "target": {"ranks": [1, 2]},
        "fault": {"kind": "gpu_xid", "xid": 79, "ttl_seconds": 30},
    }
    # Two nodes are every rank: the default blast radius (0.5) refuses it...
    with pytest.raises(InvalidExperiment, match="touch 4 of 4 ranks"):
        parse_experiment(yaml.safe_dump(data))
    # ...a wider one allows it.
    data["blast_radius"] = {"max_fraction_of_ranks": 1.0}
    experiment = parse_experiment(yaml.safe_dump(data))
    action = experiment.method[0]
    assert isinstance(action, ActionActivity)
    faults = expand(action, SHAPE)
    assert [(getattr(f, "node", None), getattr(f, "rank", None)) for f in faults] == [
        ("sw-node0", None),
        ("sw-node1", None),
    ]
    assert touched_ranks(experiment, SHAPE) == {0, 1, 2, 3}


def test_the_blast_radius_always_allows_one_rank() -> None:
    assert allowed_ranks(0.5, 4) == 2
    assert allowed_ranks(0.25, 4) == 1
    assert allowed_ranks(0.1, 4) == 1
    assert allowed_ranks(1.0, 1) == 1


def test_dry_run_prints_the_plan_with_resolved_targets_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rich.yaml"
    path.write_text(RICH)
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [str(STORMWATCH), "chaos", "run", str(path), "--dry-run", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    expected = select_ranks(
        TargetSelector.model_validate({"role": "worker", "random": {"k": 1, "seed": 7}}), SHAPE
    )
    assert f"-> rank {expected[0]}" in text, text
    assert "in the background" in text
    assert 'until count(ALERTS{alertname="StormwatchStraggler"}) >= 1' in text
    assert "safeguard loss-sane every 1 s" in text
    assert f"blast radius: touches ranks [{expected[0]}] of 4 (limit 0.5): ok" in text
    assert not run_dir.exists()


#: Files whose shape is known only at run time (``job.world_size`` alone) pass validation;
#: the dry run resolves them on the default lab and must refuse what a run would refuse.
REFUSED_AT_PLAN = [
    ("blast-radius", {"target": {"role": "any"}, "fault": {"kind": "kill_rank"}}, "touch 4 of 4"),
    (
        "random-k-above-the-ranks",
        {"target": {"random": {"k": 9}}, "fault": {"kind": "kill_rank"}},
        "random.k 9 is more than the 4 rank(s)",
    ),
    (
        "unknown-node",
        {"fault": {"kind": "gpu_xid", "node": "node9", "xid": 79}},
        "no node 'node9' (the job runs on node0, node1)",
    ),
    (
        "partition-of-an-unknown-node",
        {"fault": {"kind": "partition", "nodes": ["nodeX"]}},
        "no node 'nodeX'",
    ),
]


@pytest.mark.parametrize(
    ("action", "said"), [c[1:] for c in REFUSED_AT_PLAN], ids=[c[0] for c in REFUSED_AT_PLAN]
)
def test_a_dry_run_of_a_plan_a_run_would_refuse_exits_2_naming_why(
    tmp_path: Path, action: dict[str, Any], said: str, stormwatch
) -> None:
    data = yaml.safe_load(RICH)
    data["job"] = {"steps": 50, "checkpoint_every": 10, "world_size": 4}
    data["method"] = [{"type": "action", "name": "hit", **action}]
    folder = tmp_path / "suite"
    folder.mkdir()
    path = folder / "refused.yaml"
    path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    for command in (["run", str(path)], ["suite", str(folder)]):
        out = stormwatch("chaos", *command, "--dry-run", "--run-dir", str(run_dir))
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        error = " ".join(out.stderr.split())
        assert str(path) in error and said in error, error
        assert "Traceback" not in out.stderr
    assert not run_dir.exists()
