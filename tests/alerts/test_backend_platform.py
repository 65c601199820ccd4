"""``--platform`` chooses the responder's backend; ``--platform-config`` sets it up.

The end-to-end case runs a real responder with ``--platform slurm`` whose
``squeue``/``scontrol`` are stand-ins on PATH (no Slurm here) that log their
command lines: an alert's ``restart_workers`` becomes ``scontrol requeue``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.errors import ConfigError
from stormwatch.lab import Lab, LabConfig
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import StateStore, plan_state
from stormwatch.platforms import (
    BackendError,
    KubernetesSettings,
    LabBackend,
    LabSlurmBackend,
    PlatformSettings,
    SlurmSettings,
    load_platform_settings,
    load_target_file,
)
from stormwatch.platforms.slurm import SlurmBackend


def _settings(tmp_path: Path, **extra: Any) -> ResponderSettings:
    return ResponderSettings(db_path=tmp_path / "r.sqlite", token_file=tmp_path / "t", **extra)


def test_the_platform_setting_picks_the_backend(tmp_path: Path) -> None:
    assert _settings(tmp_path).backend() is None  # lab without a run dir: no backend
    assert isinstance(_settings(tmp_path, lab_run_dir=tmp_path).backend(), LabBackend)
    slurm = _settings(
        tmp_path,
        platform="slurm",
        platform_settings=PlatformSettings(slurm=SlurmSettings(nproc_per_node=8)),
    ).backend()
    assert isinstance(slurm, SlurmBackend) and slurm.nproc_per_node == 8
    assert slurm.diagnostics_dir == tmp_path / "diagnostics"
    with pytest.raises(ConfigError, match="platform: must be lab, kubernetes or slurm"):
        _settings(tmp_path, platform="k8s")


def test_kubernetes_without_a_cluster_configuration_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = _settings(
        tmp_path,
        platform="kubernetes",
        platform_settings=PlatformSettings(kubernetes=KubernetesSettings(namespace="train")),
    )
    with pytest.raises(BackendError, match="no in-cluster service account and no kubeconfig"):
        settings.backend()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "kubernetes: {namespace: training, drain: true}\n",
            "kubernetes.drain: unknown key (valid keys: namespace, job_label, control_dir, ",
        ),
        (
            "slurm: {nodes: 2}\n",
            "slurm.nodes: unknown key (valid keys: nproc_per_node, control_dir, conf, "
            "readback_timeout_s)",
        ),
        ("lab: {}\n", "lab: unknown key (valid keys: kubernetes, slurm, grace_period_s)"),
        (
            "kubernetes: {namespace: Bad_NS!}\n",
            "kubernetes.namespace: 'Bad_NS!' is not a Kubernetes namespace name",
        ),
        ("slurm: {nproc_per_node: -3}\n", "slurm.nproc_per_node: Input should be greater"),
        ("slurm: [\n", "not valid YAML: expected the node content"),
        ("slurm: {}\nslurm: {nproc_per_node: 4}\n", "not valid YAML: duplicate key 'slurm'"),
        ("- slurm\n", "must be a mapping with the sections kubernetes, slurm, grace_period_s"),
    ],
    ids=[
        "unknown-k8s-key",
        "unknown-slurm-key",
        "unknown-section",
        "bad-namespace",
        "neg",
        "yaml",
        "duplicate",
        "list",
    ],
)
def test_the_platform_config_file_rejects_mistakes_naming_field_and_fix(
    tmp_path: Path, text: str, said: str
) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_platform_settings(path)
    assert said in str(caught.value) and str(path) in str(caught.value)


def test_the_platform_config_file_accepts_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "platform.yaml"
    path.write_text("slurm: {nproc_per_node: 4, control_dir: '/shared/{job}/control'}\n")
    assert load_platform_settings(path).slurm == SlurmSettings(
        nproc_per_node=4, control_dir="/shared/{job}/control"
    )


def test_serve_with_a_bad_platform_config_exits_2_without_a_traceback(
    kit: Any, tmp_path: Path
) -> None:
    (tmp_path / "t").write_text("abc\n")
    config = tmp_path / "platform.yaml"
    config.write_text("slurm: {nproc_per_node: 0}\n")
    args = ["--db", str(tmp_path / "db"), "--token-file", str(tmp_path / "t")]
    args += ["--platform", "slurm", "--platform-config", str(config)]
    out = subprocess.run(
        [kit.stormwatch, "alerts", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "slurm.nproc_per_node" in out.stderr and "Traceback" not in out.stderr


_FAKE_SLURM = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
state="{log}.state"
if [ -f "$state" ]; then read -r s r < "$state"; else s=RUNNING; r=0; fi
case "$(basename "$0") $1 $2" in
  "squeue --noheader --name=train") echo "4242|gpu-[1-2]" ;;
  "squeue --noheader --steps") [ "$s" = RUNNING ] && echo "4242.batch" || true ;;
  "scontrol show hostnames") printf 'gpu-1\\ngpu-2\\n' ;;
  "scontrol requeue 4242") echo "PENDING $((r + 1))" > "$state" ;;
  "scontrol update JobId=4242") echo "RUNNING $r" > "$state" ;;
  "scontrol --oneliner show") echo "JobId=4242 JobName=train JobState=$s Restarts=$r NodeList=gpu-[1-2]" ;;
esac
"""


def test_a_responder_on_slurm_requeues_the_job_an_alert_names(
    start_responder: Any, kit: Any, tmp_path: Path
) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "slurm.log"
    bin_dir.mkdir()
    for name in ("squeue", "scontrol"):
        tool = bin_dir / name
        tool.write_text(_FAKE_SLURM.format(log=log))
        tool.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    policy = tmp_path / "policy.yml"
    policy.write_text("rules: [{alertname: StormwatchRankCrashLoop, actions: [restart_workers]}]")
    responder = start_responder("--policy", str(policy), "--platform", "slurm")
    alert = kit.alert(starts_at=time.time() - 1, alertname="StormwatchRankCrashLoop", job="train")
    assert responder.post(kit.payload(alert)).status == 200

    def finished() -> Any:
        actions = responder.get("actions")
        return actions if actions and actions[0]["status"] != "running" else None

    [action] = kit.wait_for(finished, 30, "the restart to finish")
    assert action["status"] == "succeeded", action
    assert action["detail"].startswith(
        "requeued Slurm job 4242 (train): RUNNING again on gpu-[1-2] (restart 1) after "
    )
    calls = log.read_text().splitlines()
    assert "scontrol requeue 4242" in calls
    assert "scontrol update JobId=4242 StartTime=now" in calls


def test_the_slurm_labs_responder_gets_the_slurm_lab_backend(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    paths = RunPaths.of(run_dir)
    state = plan_state(paths, LabConfig())
    StateStore(paths).save(state)
    paths.responder_dir.mkdir(parents=True)
    Lab(run_dir)._write_target_file(state)
    target = load_target_file(paths.target_file)
    assert target.lab is not None
    (tmp_path / "token").write_text("t\n")
    settings = ResponderSettings(
        db_path=paths.responder_db,
        token_file=tmp_path / "token",
        platform=target.platform,
        platform_settings=target.platform_settings(),
        lab_run_dir=target.lab.run_dir,
    )
    backend = settings.backend()
    assert isinstance(backend, LabSlurmBackend)
    assert backend.slurm.commands.conf == target.slurm.conf
    assert backend.slurm.nproc_per_node == 2
    assert backend.slurm.diagnostics_dir == paths.responder_dir / "diagnostics"
    assert dict(backend.lab.node_metrics_dirs) == {n.name: n.metrics_dir for n in state.nodes}
    assert settings.slurm_commands() is not None  # post-mortems read Slurm's history
