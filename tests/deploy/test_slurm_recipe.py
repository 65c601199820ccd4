"""The Slurm recipe, run by bash with stand-ins for srun/scontrol/torchrun/stormwatch
(no Slurm here): each records its command line; srun runs its step once per node
with that node's SLURM_NODEID, as Slurm does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

FAKE_SRUN = """#!/bin/bash
# Drop srun's own options, then run the step once per node (in order, like one task per node).
while [[ "$1" == --* ]]; do shift; done
for i in $(seq 0 $((SLURM_NNODES - 1))); do
  SLURM_NODEID=$i FAKE_HOST=gpu-$((i + 1)) "$@"
done
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2 $3" = "show hostnames gpu-[1-2]" ] && printf 'gpu-1\\ngpu-2\\n'
"""
FAKE_TOOL = """#!/bin/bash
echo "$(basename "$0") $*" >> "$FAKE_LOG"
if [ "$(basename "$0")" = torchrun ]; then
  cat "$STORMWATCH_FILE_SD/slurm-77.json" > "$FAKE_LOG.file_sd.$SLURM_NODEID"
  echo "env STORMWATCH_JOB=$STORMWATCH_JOB CONTROL=$STORMWATCH_CONTROL_DIR" >> "$FAKE_LOG"
  echo "folders $STORMWATCH_LOG_DIR $STORMWATCH_DUMP_DIR $STORMWATCH_CHECKPOINT_DIR" >> "$FAKE_LOG"
  printf 'word %s\n' "$@" >> "$FAKE_LOG.words.$SLURM_NODEID"
fi
"""


FAKE_GETENT = """#!/bin/bash
[ "$1 $2" = "ahostsv4 gpu-1" ] && echo "10.0.0.1        STREAM gpu-1"
"""


def _run_recipe(
    kit: Any, tmp_path: Path, extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    tools = {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL, "hostname": 'echo "$FAKE_HOST"\n'}
    tools["getent"] = FAKE_GETENT
    tools |= {"torchrun": FAKE_TOOL, "stormwatch": FAKE_TOOL}
    for name, text in tools.items():
        path = bin_dir / name
        path.write_text(text if text.startswith("#!") else "#!/bin/bash\n" + text)
        path.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_LOG": str(log),
        "SLURM_JOB_NAME": "llm",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "gpu-[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_GPUS_ON_NODE": "4",
        "STORMWATCH_SHARED": str(tmp_path / "shared"),
        "STORMWATCH_FILE_SD": str(tmp_path / "sd"),
        "STORMWATCH_VENV": str(tmp_path / "venv"),
        "TRAIN_ARGS": "--steps 5",
        **(extra or {}),
    }
    done = subprocess.run(
        ["bash", str(kit.deploy / "slurm" / "train.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, log


def test_the_recipe_starts_an_agent_and_torchrun_on_every_node(kit: Any, tmp_path: Path) -> None:
    done, log = _run_recipe(kit, tmp_path)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    agents = sorted(c for c in calls if c.startswith("stormwatch agent run"))
    assert agents == [
        f"stormwatch agent run --listen 0.0.0.0:9402 --node gpu-{n} --metrics-dir "
        f"/tmp/stormwatch-77/metrics --gpu-backend nvml --state-dir /tmp/stormwatch-77/agent"
        for n in (1, 2)
    ]
    shared = tmp_path / "shared"
    torchruns = [c for c in calls if c.startswith("torchrun")]
    assert torchruns == [
        f"torchrun --nnodes 2 --nproc-per-node 4 --node-rank {i} --master-addr gpu-1 "
        "--master-port 29500 --max-restarts 0 --no-python stormwatch train "
        f"--checkpoint-dir {shared}/checkpoints --log-dir {shared}/logs --steps 5"
        for i in (0, 1)
    ]
    assert f"env STORMWATCH_JOB=llm CONTROL={shared}/control" in calls


def test_a_job_command_replaces_stormwatch_train_word_for_word_with_its_folders(
    kit: Any, tmp_path: Path
) -> None:
    command = "python '/opt/my jobs/train.py' --max-steps 5 --name 'a b'"
    done, log = _run_recipe(kit, tmp_path, {"STORMWATCH_COMMAND": command})
    assert done.returncode == 0, done.stderr
    for node in (0, 1):
        words = Path(f"{log}.words.{node}").read_text().splitlines()
        program = words[words.index("word --no-python") + 1 :]
        assert program == [
            "word python", "word /opt/my jobs/train.py", "word --max-steps", "word 5",
            "word --name", "word a b",
        ]  # fmt: skip
    shared = tmp_path / "shared"
    calls = log.read_text().splitlines()
    assert f"folders {shared}/logs {shared}/logs/dumps {shared}/checkpoints" in calls
    assert not [c for c in calls if c.startswith("stormwatch train")]
    assert (shared / "checkpoints").is_dir() and (shared / "logs").is_dir()


def test_with_site_agents_the_recipe_starts_no_agent_and_writes_no_file_sd(
    kit: Any, tmp_path: Path
) -> None:
    metrics = tmp_path / "site" / "%n" / "metrics"
    settings = {
        "STORMWATCH_SITE_AGENT": "1",
        "STORMWATCH_METRICS_DIR": str(metrics),
        "STORMWATCH_MAX_RESTARTS": "3",
        "STORMWATCH_RDZV_PORT": "29610",
    }
    done, log = _run_recipe(kit, tmp_path, settings)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert not [c for c in calls if c.startswith("stormwatch agent")]
    assert not (tmp_path / "sd").exists()
    torchruns = [c for c in calls if c.startswith("torchrun")]
    assert [c.split(" --max-restarts")[0] for c in torchruns] == [
        f"torchrun --nnodes 2 --nproc-per-node 4 --node-rank {i} --rdzv-backend c10d "
        f"--rdzv-id 77 --rdzv-endpoint 10.0.0.1:29610 --rdzv-conf is_host={1 - i}"
        for i in (0, 1)
    ]
    assert all(" --max-restarts 3 " in c for c in torchruns)
    # Each node's ranks write into that node's site agent folder ("%n": its name).
    assert (tmp_path / "site" / "gpu-1" / "metrics").is_dir()
    assert (tmp_path / "site" / "gpu-2" / "metrics").is_dir()


def test_prometheus_finds_the_agents_only_while_the_job_runs(kit: Any, tmp_path: Path) -> None:
    done, log = _run_recipe(kit, tmp_path)
    assert done.returncode == 0, done.stderr
    during = json.loads(Path(f"{log}.file_sd.0").read_text())
    assert during == [
        {
            "targets": ["gpu-1:9402", "gpu-2:9402"],
            "labels": {"slurm_job_id": "77", "slurm_job_name": "llm"},
        }
    ]
    assert not (tmp_path / "sd" / "slurm-77.json").exists()


def test_the_scrape_config_is_accepted_by_promtool(kit: Any, tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text((kit.deploy / "slurm" / "prometheus-scrape.yml").read_text())
    done = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_slurm_scrape_job_is_the_one_the_agent_rules_select(kit: Any) -> None:
    """The rules select the agents by `up{job="stormwatch-agent"}`: a scrape job named
    otherwise (it was `stormwatch-agents`) leaves every agent and target alert blind."""
    from stormwatch.alerts import rule_files

    document = yaml.safe_load((kit.deploy / "slurm" / "prometheus-scrape.yml").read_text())
    [job] = document["scrape_configs"]
    selector = f'job="{job["job_name"]}"'
    for name in ("nodes.yml", "targets.yml"):
        [path] = [p for p in rule_files() if p.name == name]
        assert selector in path.read_text(), (name, selector)
