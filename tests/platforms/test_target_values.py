"""Target-file values refused when the file is loaded (stormwatch.platforms.target_values):
each bad value is one error naming the field and the fix, and ``chaos run`` exits 2 with
it before anything starts (no Slurm needed: nothing reaches the cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormwatch.cli import main
from stormwatch.platforms import InvalidTargetFile, load_target_file
from stormwatch.platforms.target_values import check_agent_host

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "kill-rank.yaml"

SUBMIT = """\
platform: slurm
prometheus:
  url: http://prometheus.example:9090
credentials:
  agent_token_file: agent.token
job:
  submit:
    template: train.sbatch
    parameters:
      IMAGE: x
  log_dir: /shared/{job}/logs
slurm:
  nproc_per_node: 2
"""

#: (change to SUBMIT, field, words of the fix).
BAD = [
    (("/shared/{job}/logs", "/x/{nope}/logs"), "job.log_dir", "only {job} and {jobid}"),
    (("/shared/{job}/logs", "/x/{}/logs"), "job.log_dir", "only {job} and {jobid}"),
    (("agents:", "agents:"), None, None),  # placeholder row replaced below
    (("IMAGE: x", 'IMAGE: "a\\0b"'), "job.submit.parameters", "NUL byte"),
    (("IMAGE: x", "NODES: 4"), "job.submit.parameters.NODES", "quote it: '4'"),
    (("IMAGE: x", "PATH: /bin"), "job.submit.parameters", "PATH: reserved"),
    (("IMAGE: x", "SLURM_CONF: /x"), "job.submit.parameters", "set them in the batch script"),
    (("nproc_per_node: 2", "nproc_per_node: 2\n  conf: nope.conf"), "slurm.conf", "slurm.conf"),
    (("template: train.sbatch", "template: binary.sbatch"), "job.submit.template", "UTF-8"),
    (("template: train.sbatch", "template: folder"), "job.submit.template", "a folder"),
    (
        ("  url: http://prometheus.example:9090", "  url: http://p:9090\n  http: "
         "{bearer_token_file: nope.token}"),
        "prometheus.http.bearer_token_file",
        "is not a file",
    ),
]  # fmt: skip
BAD = [b for b in BAD if b[1] is not None] + [
    (("platform: slurm", f"platform: slurm\nagents: {{host: '{host}'}}"), "agents.host", fix)
    for host, fix in [
        ("{node}.{cluster}", "only {node} and {addr}"),
        ("evil.example/{node}", "not a host name or IP"),
        ("http://{node}", "not a host name or IP"),
        ("{node}:99", "not a host name or IP"),
        ("{node} x", "not a host name or IP"),
    ]
]


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "agent.token").write_text("t\n")
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun true\n")
    (tmp_path / "binary.sbatch").write_bytes(b"#!/bin/bash\n\xff\xfe\x00srun\n")
    (tmp_path / "folder").mkdir(exist_ok=True)
    path = tmp_path / "target.yaml"
    path.write_text(text)
    return path


def test_the_submit_target_used_here_loads(tmp_path: Path) -> None:
    target = load_target_file(_write(tmp_path, SUBMIT))
    assert target.job is not None and target.job.log_dir == "/shared/{job}/logs"


@pytest.mark.parametrize(("change", "field", "fix"), BAD, ids=[b[1] or "" for b in BAD])
def test_a_bad_value_is_refused_at_load_naming_the_field_and_the_fix(
    tmp_path: Path, change: tuple[str, str], field: str, fix: str
) -> None:
    old, new = change
    assert old in SUBMIT
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(_write(tmp_path, SUBMIT.replace(old, new, 1)))
    assert [i.path for i in caught.value.issues] == [field]
    assert fix in caught.value.issues[0].message


def test_every_reserved_parameter_name_is_reported_at_once(tmp_path: Path) -> None:
    text = SUBMIT.replace("IMAGE: x", "PATH: /bin\n      LD_PRELOAD: x\n      SLURM_JOB_NAME: j")
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(_write(tmp_path, text))
    [issue] = caught.value.issues
    assert "PATH, LD_PRELOAD, SLURM_JOB_NAME: reserved" in issue.message


def test_every_bad_parameter_name_is_reported_at_once(tmp_path: Path) -> None:
    text = SUBMIT.replace("IMAGE: x", "a-b: x\n      c d: y")
    with pytest.raises(InvalidTargetFile) as caught:
        load_target_file(_write(tmp_path, text))
    [issue] = caught.value.issues
    assert "'a-b', 'c d': not environment variable names" in issue.message


def test_reserved_names_are_slurm_only(tmp_path: Path) -> None:
    """A Kubernetes template's parameters fill ${NAME} placeholders, not an environment."""
    from stormwatch.platforms.target_values import reserved_parameter_issues

    assert reserved_parameter_issues({"IMAGE": "x", "TRAIN_ARGS": "--a"}) == []


@pytest.mark.parametrize("host", ["{node}", "{addr}", "{node}.ib.example.org", "gpu-{node}"])
def test_a_bare_host_pattern_is_accepted(host: str) -> None:
    assert check_agent_host(host) == host


@pytest.mark.parametrize(("change", "field", "fix"), BAD, ids=[b[1] or "" for b in BAD])
def test_chaos_run_exits_2_with_the_field_before_anything_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str],
    field: str,
    fix: str,
) -> None:
    target = _write(tmp_path, SUBMIT.replace(*change, 1))
    run_dir = tmp_path / "run"
    argv = ["chaos", "run", str(EXPERIMENT), "--target", str(target), "--run-dir", str(run_dir)]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr()
    output = out.out + out.err
    assert exited.value.code == 2, output
    assert f"{field}: " in output and fix in output
    assert "Traceback" not in output
    assert not run_dir.exists()
