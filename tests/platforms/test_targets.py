"""Target files (stormwatch.platforms.targets): every bad value gives one clear error naming
the field and the fix, nothing is started; the shipped example is valid; a target builds
the runner's Target for Slurm (fake commands) and Kubernetes (the client's typed API)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.chaos.platform_target import slurm_target
from stormwatch.cli import main
from stormwatch.platforms import InvalidTargetFile, PlatformSettings, load_target_file
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.targets import dump_target_file, lab_target_file

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "slurm" / "target.yaml"

GOOD = """\
platform: slurm
prometheus:
  url: http://prometheus.example:9090
agents:
  port: 9402
credentials:
  agent_token_file: agent.token
job:
  attach:
    name: llm
slurm:
  nproc_per_node: 2
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "agent.token").write_text("t\n")
    path = tmp_path / "target.yaml"
    path.write_text(text)
    return path


def test_a_hand_written_slurm_target_file_loads(tmp_path: Path) -> None:
    target = load_target_file(_write(tmp_path, GOOD))
    assert target.platform == "slurm"
    assert target.credentials.agent_token_file == tmp_path / "agent.token"
    assert target.job is not None and target.job.attach is not None
    assert target.job.attach.name == "llm"
    assert isinstance(target.platform_settings(), PlatformSettings)
    assert target.platform_settings().slurm.nproc_per_node == 2


def test_the_shipped_example_is_valid(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "target.yaml")
    (tmp_path / "secrets").mkdir()
    for name in ("site-ca.pem", "prometheus.token", "agent.token", "responder.token"):
        (tmp_path / "secrets" / name).write_text("x\n")
    target = load_target_file(tmp_path / "target.yaml")
    assert target.prometheus is not None and target.prometheus.http.ca_file is not None
    assert target.agents.fault_port == 9401


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        (("platform: slurm", "platform: slrum"), "platform", "'slurm', 'kubernetes' or 'lab'"),
        (
            ("url: http://prometheus.example:9090", "url: prometheus:9090"),
            "prometheus.url",
            "e.g. http://",
        ),
        (("  url: http", "  urll: x\n  url: http"), "prometheus.urll", "valid keys: url, http"),
        (("  port: 9402", "  port: 0"), "agents.port", "greater than or equal to 1"),
        (("  port: 9402", "  port: 9402\n  scheme: ftp"), "agents.scheme", "'http' or 'https'"),
        (("  port: 9402", "  port: 9402\n  host: node.example"), "agents.host", "{node} or {addr}"),
        (
            ("  port: 9402", "  port: 9402\n  selector: app=x"),
            "agents.selector",
            "only for kubernetes",
        ),
        (("agent.token", "missing.token"), "credentials.agent_token_file", "is not a file"),
        (
            ("    name: llm", "    name: llm\n    id: '12'"),
            "job.attach",
            "exactly one of id and name",
        ),
        (("    name: llm", "    id: abc"), "job.attach.id", "not a Slurm job id"),
        (
            ("  attach:", "  submit: {template: nope.sbatch}\n  attach:"),
            "job.submit.template",
            "is not a file",
        ),
        (
            ("  nproc_per_node: 2", "  nproc_per_node: 0"),
            "slurm.nproc_per_node",
            "greater than or equal to 1",
        ),
        (("  nproc_per_node: 2", "  nprocs: 2"), "slurm.nprocs", "valid keys: nproc_per_node"),
        (
            ("slurm:\n", "colour: red\nslurm:\n"),
            "colour",
            "valid keys: kubernetes, slurm, grace_period_s, platform",
        ),
        (("agents:", "lab: {run_dir: run}\nagents:"), "lab", "only for platform lab"),
        (
            ("  nproc_per_node: 2", "  nproc_per_node: 2\n  control_dir: /s/{host}/control"),
            "slurm.control_dir",
            "only {job}, {jobid}, {node} may be substituted",
        ),
        (
            ("slurm:\n", "grace_period_s: -1\nslurm:\n"),
            "grace_period_s",
            "greater than or equal to 0",
        ),
        (
            ("slurm:\n", "grace_period_s: 86400\nslurm:\n"),
            "grace_period_s",
            "less than or equal to 3600",
        ),
        (("slurm:\n", "grace_period_s: soon\nslurm:\n"), "grace_period_s", "valid integer"),
        (
            ("slurm:\n", "kubernetes: {grace_period_s: 45}\nslurm:\n"),
            "kubernetes",
            "grace_period_s moved out of the kubernetes section: give it at the top level, "
            "grace_period_s: 45",
        ),
    ],
)
def test_each_bad_value_is_one_error_naming_the_field_and_the_fix(
    tmp_path: Path, change: tuple[str, str], field: str, fix: str
) -> None:
    old, new = change
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(path)
    assert [i.path for i in caught.value.issues] == [field]
    assert fix in caught.value.issues[0].message
    assert caught.value.issues[0].line is not None
    assert f"{path}:{caught.value.issues[0].line}: {field}: " in str(caught.value)


def test_the_http_options_problem_is_placed_at_its_field(tmp_path: Path) -> None:
    text = GOOD.replace("  url: http", "  http: {password: x}\n  url: http")
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(_write(tmp_path, text))
    assert [i.path for i in caught.value.issues] == ["prometheus.http.password"]
    assert "needs username" in caught.value.issues[0].message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("platform: slurm\nplatform: lab\n", "duplicate key 'platform'"),
        ("platform: [\n", "not valid YAML"),
        ("- a\n", "must be a mapping"),
        ("platform: slurm\n", "prometheus: required"),
        (
            "platform: kubernetes\nprometheus: {url: 'http://p:9090'}\njob: {attach: {name: j}}\n",
            "agents.selector: required for kubernetes",
        ),
        ("platform: lab\n", "lab: required for platform lab"),
        (
            "platform: kubernetes\nprometheus: {url: 'http://p:9090'}\nlab: {run_dir: run}\n"
            "agents: {selector: app=agent}\n",
            "lab: only for platform lab, or for a Slurm lab's slurm target",
        ),
        (
            "platform: lab\nlab: {run_dir: run}\njob: {attach: {name: j}}\n",
            "job: not used by platform lab",
        ),
    ],
)
def test_file_level_and_platform_problems_are_named(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(InvalidTargetFile, match="invalid target file") as caught:
        load_target_file(_write(tmp_path, text))
    assert expected in str(caught.value)


def test_the_lab_target_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "target.yaml"
    path.write_text(dump_target_file(lab_target_file(tmp_path / "run")))
    target = load_target_file(path)
    assert target.platform == "lab"
    assert target.lab is not None and target.lab.run_dir == tmp_path / "run"


def test_the_grace_period_is_one_top_level_setting_every_platform_reads(tmp_path: Path) -> None:
    path = tmp_path / "target.yaml"
    path.write_text(dump_target_file(lab_target_file(tmp_path / "run", grace_period_s=7)))
    assert load_target_file(path).grace_period_s == 7  # a lab target may carry it
    assert load_target_file(_write(tmp_path, GOOD)).grace_period_s == 30  # the default
    target = load_target_file(_write(tmp_path, "grace_period_s: 0\n" + GOOD))
    assert target.platform_settings().grace_period_s == 0  # what the responder's backend gets


@pytest.mark.parametrize(
    ("kill_wait", "ok"), [("", True), ("KillWait=20", True), ("killwait=60", False)]
)
def test_a_slurm_conf_whose_kill_wait_outlasts_the_grace_period_is_refused(
    tmp_path: Path, kill_wait: str, ok: bool
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=c\n{kill_wait}\nSlurmctldHost=h\n")
    text = GOOD.replace("slurm:\n", f"slurm:\n  conf: {conf}\n") + "grace_period_s: 30\n"
    if ok:  # Slurm's default KillWait is 30 s
        load_target_file(_write(tmp_path, text))
        return
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(_write(tmp_path, text))
    [issue] = caught.value.issues
    assert issue.path == "grace_period_s" and issue.line == 14
    assert "30 s is shorter than KillWait=60" in issue.message
    assert "give grace_period_s: 60 or more, or lower the cluster's KillWait" in issue.message


class _FakeSlurm(SlurmCommands):
    """Answers the commands a slurm target runs, for job 42 on gpu[1-2]."""

    def __call__(self, argv: Sequence[str]) -> str:
        text = " ".join(argv)
        if text.startswith("squeue"):
            return "42|gpu[1-2]\n"
        if text.startswith("scontrol show hostnames"):
            return "gpu1\ngpu2\n"
        if text.startswith("scontrol --oneliner show job"):
            return "JobId=42 JobName=llm JobState=RUNNING NodeList=gpu[1-2] ExitCode=0:0\n"
        if text.startswith("scontrol --oneliner show node"):
            return (
                "NodeName=gpu1 NodeAddr=10.0.0.1 State=ALLOCATED\n"
                "NodeName=gpu2 NodeAddr=10.0.0.2 State=ALLOCATED\n"
            )
        raise AssertionError(text)


@pytest.mark.parametrize("attach", ["name: llm", "id: '42'"])
def test_a_slurm_target_lists_the_jobs_nodes_agents_and_placement(
    tmp_path: Path, attach: str
) -> None:
    text = GOOD.replace("name: llm", attach).replace("port: 9402", "port: 9402\n  host: '{addr}'")
    target = slurm_target(load_target_file(_write(tmp_path, text)), tmp_path, commands=_FakeSlurm())
    assert [(a.node, a.url) for a in target.agents] == [
        ("gpu1", "http://10.0.0.1:9402"),
        ("gpu2", "http://10.0.0.2:9402"),
    ]
    assert target.world_size == 4
    assert target.attach_job == "llm"
    assert target.placement is not None
    assert dict(target.placement.ranks("llm")) == {0: "gpu1", 1: "gpu1", 2: "gpu2", 3: "gpu2"}
    assert target.prometheus_url == "http://prometheus.example:9090"
    assert target.jobs.attach("llm").log_dir == tmp_path / "jobs" / "llm" / "logs"
    assert target.jobs.exited("llm") is None


#: The shipped kill-rank experiment (4 ranks, 2 nodes).
EXPERIMENT = REPO / "experiments" / "kill-rank.yaml"


def _stormwatch(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out + out.err


def test_chaos_run_dry_run_on_a_target_it_cannot_reach_says_why_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Slurm here: the plan is printed on the job section's shape, labelled as such, and
    the dry run fails (its help promises the targets resolved on --target)."""
    target = _write(tmp_path, GOOD)
    experiment = EXPERIMENT
    run_dir = tmp_path / "run"
    argv = ["chaos", "run", str(experiment), "--dry-run", "--target", str(target)]
    code, output = _stormwatch([*argv, "--run-dir", str(run_dir)], capsys)
    assert code == 2, output
    assert f"target: --target {target} could not be resolved: target job llm" in output
    assert (
        "4 ranks on 2 nodes (job.world_size on the default lab's 2 job nodes; not the target's)"
        in (output)
    )
    assert "kill_rank" in output and "(the lab)" not in output and "Traceback" not in output
    assert not run_dir.exists()  # nothing started, nothing written


def test_chaos_run_refuses_a_bad_target_file_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _write(tmp_path, GOOD.replace("port: 9402", "port: 99999"))
    experiment = EXPERIMENT
    run_dir = tmp_path / "run"
    argv = ["chaos", "run", str(experiment), "--target", str(target)]
    code, output = _stormwatch([*argv, "--run-dir", str(run_dir)], capsys)
    assert code == 2, output
    assert "agents.port" in output
    assert not run_dir.exists()


def test_a_slurm_target_with_a_lab_section_needs_no_job(tmp_path: Path) -> None:
    """The Slurm lab's own target (``lab up`` writes it): the lab starts the jobs."""
    text = GOOD.split("job:")[0] + "lab: {run_dir: run}\nslurm:\n  control_dir: /r/{node}/c\n"
    target = load_target_file(_write(tmp_path, text))
    assert target.platform == "slurm" and target.job is None
    assert target.lab is not None and target.lab.run_dir == tmp_path / "run"
    assert target.slurm.control_dir == "/r/{node}/c"
