"""A kubernetes target file, as the chaos runner uses it, against recorded API responses:
attach to a running job or submit one from a template (created only when the run starts
it), the job's outcome and end, stopping what the run started, and bad target files
refused before anything is asked or created."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.platform_target_kubernetes import kubernetes_target
from stormwatch.chaos.target import Target
from stormwatch.cli import main
from stormwatch.platforms import InvalidTargetFile, load_target_file
from stormwatch.platforms.kubernetes import KubernetesBackend, RecordedKubeApi, render_template

RECORDINGS = Path(__file__).parent / "recordings" / "kubernetes"
REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "deploy" / "kubernetes" / "examples" / "templates"
NS = "training"
AGENTS = "GET /api/v1/namespaces/stormwatch/pods?labelSelector=app=agent"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
LLM_CTRL = "batch.kubernetes.io/controller-uid=5f0c2a4e-1b7d-4c1e-9a55-3c2f1e0d9b11"
RUN_CTRL = "batch.kubernetes.io/controller-uid=3c1d2e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
IMAGE = "ghcr.io/stormwatch/stormwatch:0.1.0"

HEAD = (
    "platform: kubernetes\nprometheus: {url: 'http://p:9090'}\n"
    "agents: {selector: app=agent, namespace: stormwatch}\n"
    f"kubernetes: {{namespace: {NS}}}\n"
)
ATTACH = HEAD + "job: {attach: {name: llm}}\n"


def _submit(template: str, parameters: str = f"{{IMAGE: '{IMAGE}'}}") -> str:
    return (
        HEAD + f"job:\n  submit: {{template: {template}, parameters: {parameters}}}\n"
        "  log_dir: /mnt/shared/{job}/logs\n"
    )


def _write(tmp_path: Path, text: str) -> Path:
    shutil.copytree(TEMPLATES, tmp_path / "templates", dirs_exist_ok=True)
    path = tmp_path / "target.yaml"
    path.write_text(text)
    return path


class Clock:
    """Unix time that moves only when the backend sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _target(tmp_path: Path, text: str, api: RecordedKubeApi, **backend: Any) -> Target:
    api.answer(AGENTS, "pods-agents.json")
    made = KubernetesBackend(api=api, namespace=NS, diagnostics_dir=tmp_path, **backend)
    return kubernetes_target(load_target_file(_write(tmp_path, text)), tmp_path, backend=made)


def _job(name: str = "llm_run") -> JobSection:
    return JobSection(name=name, steps=100, checkpoint_every=10)


def test_an_attaching_target_places_the_job_and_finds_the_agent_daemonset_pods(
    tmp_path: Path,
) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"GET {JOBS}/llm", "job-llm.json")
    api.answer(
        f"GET /api/v1/namespaces/{NS}/pods?labelSelector={LLM_CTRL}", "pods-llm-running.json"
    )
    target = _target(tmp_path, ATTACH, api)
    # gpu-c's agent pod is not Ready: not an endpoint; the port is the pods' "metrics" port.
    assert [(a.node, a.url, a.pod) for a in target.agents] == [
        ("gpu-a", "http://10.244.1.5:9400", "stormwatch/stormwatch-agent-4xk9d"),
        ("gpu-b", "http://10.244.2.5:9400", "stormwatch/stormwatch-agent-8mz2q"),
    ]
    assert (target.world_size, target.attach_job) == (4, "llm")
    assert api.requests("GET")[-1] == AGENTS


def test_the_attached_jobs_outcome_is_its_status_and_it_ends_when_its_pods_are_gone(
    tmp_path: Path,
) -> None:
    api = RecordedKubeApi(RECORDINGS)
    running, done = ["job-llm.json"] * 3, "job-llm-complete.json"  # target, attach, exited
    api.answer(f"GET {JOBS}/llm", *running, done)
    pods = f"GET /api/v1/namespaces/{NS}/pods?labelSelector={LLM_CTRL}"
    api.answer(pods, *["pods-llm-running.json"] * 3, "pods-llm-none.json")
    jobs = _target(tmp_path, ATTACH, api).jobs
    ref = jobs.attach("llm")
    assert (ref.name, ref.world_size, ref.started_by_runner) == ("llm", 4, False)
    assert jobs.exited("llm") is None  # running
    assert jobs.exited("llm") is True  # Complete
    assert jobs.ended("llm") is False  # torchrun still shutting down
    assert jobs.ended("llm") is True
    with pytest.raises(ChaosError, match="not started by stormwatch chaos"):
        jobs.stop("llm")
    assert api.requests("DELETE") == []


def test_a_submitting_target_creates_nothing_until_the_run_starts_the_job(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS)
    target = _target(tmp_path, _submit("templates/training-job.yaml"), api)
    assert target.attach_job is None  # the runner starts the job
    assert target.world_size == 16  # the template: 2 pods x PET_NPROC_PER_NODE 8
    assert api.requests() == [AGENTS]  # what a --dry-run asks: no POST


def test_the_run_creates_the_indexed_job_under_its_name_and_stops_it(
    tmp_path: Path, kube_validate: Callable[[dict[str, Any]], None]
) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"POST {JOBS}", "job-llm-run-created.json")
    api.answer(f"GET {JOBS}/llm-run", "job-llm-run-created.json")
    api.answer(f"DELETE {JOBS}/llm-run", "status-200-job-llm-run-deleted.json")
    api.answer(f"GET /api/v1/namespaces/{NS}/pods?labelSelector={RUN_CTRL}", "pods-llm-none.json")
    jobs = _target(tmp_path, _submit("templates/training-job.yaml"), api).jobs
    ref = jobs.start(_job())
    assert (ref.name, ref.world_size, ref.started_by_runner) == ("llm-run", 16, True)
    assert ref.log_dir == Path("/mnt/shared/llm-run/logs")
    (sent,) = [body for line, body in api.calls if line.startswith("POST")]
    run = {"STORMWATCH_JOB": "llm-run", "STORMWATCH_STEPS": "100"}
    run["STORMWATCH_CHECKPOINT_EVERY"] = "10"
    expected = render_template(TEMPLATES / "training-job.yaml", {"IMAGE": IMAGE}, run).body
    assert sent == expected  # the template, filled, as the client put it on the wire
    kube_validate(sent)
    assert "--steps=100" in sent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert jobs.exited("llm-run") is None  # created, no terminal condition yet
    jobs.stop("llm-run")
    assert api.calls[-2] == (
        f"DELETE {JOBS}/llm-run",
        {"gracePeriodSeconds": 30, "propagationPolicy": "Background"},
    )
    assert api.calls[-1] == (f"GET /api/v1/namespaces/{NS}/pods?labelSelector={RUN_CTRL}", None)
    assert jobs.ended("llm-run") is True


def _started_run(tmp_path: Path, *pod_lists: str) -> tuple[Any, RecordedKubeApi, Clock]:
    """The run's Job ``llm-run`` started, its pods listed as ``pod_lists`` from then on."""
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"POST {JOBS}", "job-llm-run-created.json")
    api.answer(f"DELETE {JOBS}/llm-run", "status-200-job-llm-run-deleted.json")
    api.answer(f"GET /api/v1/namespaces/{NS}/pods?labelSelector={RUN_CTRL}", *pod_lists)
    clock = Clock()
    backend = {"clock": clock, "sleep": clock.sleep, "grace_period_s": 5, "poll_s": 1.0}
    jobs = _target(tmp_path, _submit("templates/training-job.yaml"), api, **backend).jobs
    jobs.start(_job())
    return jobs, api, clock


def test_stopping_the_runs_job_returns_once_its_pods_are_gone_not_when_deleted(
    tmp_path: Path,
) -> None:
    # What a run that aborts (or a baseline that fails) does with the job it started: the
    # pods terminate for a while (a rank blocked in a collective is SIGKILLed only at the
    # grace period), and the next run must not start beside them.
    jobs, api, clock = _started_run(
        tmp_path, "pods-llm-terminating.json", "pods-llm-terminating.json", "pods-llm-none.json"
    )
    jobs.stop("llm-run")
    delete = [n for n, (line, _) in enumerate(api.calls) if line.startswith("DELETE")]
    assert api.calls[delete[0]][1] == {"gracePeriodSeconds": 5, "propagationPolicy": "Background"}
    listed = [line for line, _ in api.calls[delete[0] :] if line.startswith("GET")]
    assert len(listed) == 3 and clock.now == 102.0  # terminating, terminating, gone


def test_a_runs_job_whose_pods_outlive_the_grace_period_is_not_stopped(tmp_path: Path) -> None:
    jobs, _, clock = _started_run(tmp_path, "pods-llm-terminating.json")
    with pytest.raises(ChaosError) as caught:
        jobs.stop("llm-run")
    message = str(caught.value)
    assert "could not stop job 'llm-run': deleted Job llm-run in namespace training, but" in (
        message
    )
    assert "after 65 s these pods still run" in message  # grace 5 s + the kubelet's margin
    assert "llm-0-x7k2p (uid 0a1e0b5c, Running, node gpu-a)" in message
    assert "llm-1-a1b2c" not in message  # an earlier try's Failed pod has no process left
    assert clock.now >= 165.0


def test_the_run_posts_a_jobset_template_to_the_jobset_api(
    tmp_path: Path, kube_validate: Callable[[dict[str, Any]], None]
) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"POST {JOBSETS}", "jobset-pt-run-created.json")
    api.answer(f"DELETE {JOBSETS}/pt-run", "status-200-jobset-pt-run-deleted.json")
    jobs = _target(tmp_path, _submit("templates/training-jobset.yaml"), api).jobs
    ref = jobs.start(_job("pt_run"))
    assert (ref.name, ref.started_by_runner) == ("pt-run", True)
    (sent,) = [body for line, body in api.calls if line.startswith("POST")]
    kube_validate(sent)  # against the JobSet CRD's schema
    rdzv = sent["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "--rdzv-endpoint=pt-run-workers-0-0.pt-run:29500" in rdzv["containers"][0]["args"]
    pods = f"GET /api/v1/namespaces/{NS}/pods?labelSelector=jobset.sigs.k8s.io/jobset-name=pt-run"
    api.answer(pods, "pods-llm-none.json")
    jobs.stop("pt-run")
    assert api.requests("DELETE") == [f"DELETE {JOBSETS}/pt-run"]
    assert api.requests("GET")[-1] == pods  # waited for its pods to be gone


def test_a_refused_create_names_the_rbac_grant_the_launcher_needs(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS).answer(f"POST {JOBS}", "status-403-create-job.json")
    jobs = _target(tmp_path, _submit("templates/training-job.yaml"), api).jobs
    with pytest.raises(ChaosError, match=r"'create' on 'jobs' \(API group batch\) in namespace"):
        jobs.start(_job())


def test_a_job_that_exists_is_not_overwritten(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS).answer(f"POST {JOBS}", "status-409-job-exists.json")
    jobs = _target(tmp_path, _submit("templates/training-job.yaml"), api).jobs
    with pytest.raises(ChaosError, match="409"):
        jobs.start(_job())
    with pytest.raises(ChaosError, match="not started by stormwatch chaos"):
        jobs.stop("llm-run")  # not ours: left alone


def test_an_attaching_target_starts_nothing(tmp_path: Path) -> None:
    api = RecordedKubeApi(RECORDINGS)
    api.answer(f"GET {JOBS}/llm", "job-llm.json")
    api.answer(
        f"GET /api/v1/namespaces/{NS}/pods?labelSelector={LLM_CTRL}", "pods-llm-running.json"
    )
    jobs = _target(tmp_path, ATTACH, api).jobs
    with pytest.raises(ChaosError, match="attaches to job 'llm'"):
        jobs.start(_job())
    assert api.requests("POST") == []


#: (what is wrong, the target file, the field named, what it says)
BAD_TARGETS = [
    ("template not YAML", "bad.yaml", "job.submit.template", "not YAML"),
    ("template of a Deployment", "deployment.yaml", "job.submit.template", "kind: 'Deployment'"),
    ("template without a name", "noname.yaml", "job.submit.template", "metadata.name: required"),
    ("placeholder not given", "templates/training-job.yaml", "job.submit.parameters", "${IMAGE}"),
]
TEMPLATE_TEXT = {
    "bad.yaml": "kind: Job\n  metadata: [",
    "deployment.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
    "noname.yaml": "apiVersion: batch/v1\nkind: Job\nmetadata: {labels: {a: b}}\n",
}


@pytest.mark.parametrize(
    ("case", "template", "field", "says"), BAD_TARGETS, ids=[b[0] for b in BAD_TARGETS]
)
def test_a_bad_template_is_one_target_file_error_naming_the_field(
    tmp_path: Path, case: str, template: str, field: str, says: str
) -> None:
    for name, text in TEMPLATE_TEXT.items():
        (tmp_path / name).write_text(text)
    parameters = "{}" if case == "placeholder not given" else f"{{IMAGE: '{IMAGE}'}}"
    with pytest.raises(InvalidTargetFile) as raised:
        load_target_file(_write(tmp_path, _submit(template, parameters)))
    (issue,) = raised.value.issues
    assert issue.path == field, case
    assert says in issue.message
    assert issue.line is not None  # placed at the field's line of the target file


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("agents: {selector: app=agent, namespace: stormwatch, port: 9400}", "agents.port"),
        (
            "agents: {selector: app=agent, namespace: stormwatch, fault_port: 1}",
            "agents.fault_port",
        ),
    ],
)
def test_agent_ports_are_the_pods_not_the_target_files(
    tmp_path: Path, change: str, field: str
) -> None:
    text = ATTACH.replace("agents: {selector: app=agent, namespace: stormwatch}", change)
    with pytest.raises(InvalidTargetFile, match="container ports named metrics") as raised:
        load_target_file(_write(tmp_path, text))
    assert [i.path for i in raised.value.issues] == [field]


def test_a_kubernetes_job_is_attached_by_name_not_id(tmp_path: Path) -> None:
    text = ATTACH.replace("name: llm", "id: '42'")
    with pytest.raises(InvalidTargetFile, match="kubernetes attaches by name") as raised:
        load_target_file(_write(tmp_path, text))
    assert [i.path for i in raised.value.issues] == ["job.attach.id"]


def test_the_shipped_kubernetes_target_file_is_valid(tmp_path: Path) -> None:
    kubernetes = REPO / "deploy" / "kubernetes"
    shutil.copy(kubernetes / "target.yaml", tmp_path / "target.yaml")
    shutil.copytree(kubernetes / "examples", tmp_path / "examples")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "agent.token").write_text("t\n")
    target = load_target_file(tmp_path / "target.yaml")
    assert target.job is not None and target.job.submit is not None
    assert target.job.submit.template == tmp_path / "examples/templates/training-jobset.yaml"


def test_chaos_run_refuses_a_bad_template_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "deployment.yaml").write_text(TEMPLATE_TEXT["deployment.yaml"])
    target = _write(tmp_path, _submit("deployment.yaml"))
    run_dir = tmp_path / "run"
    experiment = REPO / "experiments" / "kill-rank.yaml"
    argv = ["chaos", "run", str(experiment), "--target", str(target), "--run-dir", str(run_dir)]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr()
    assert exited.value.code == 2, out
    assert "job.submit.template" in out.out + out.err
    assert "is not Job or JobSet" in out.out + out.err
    assert not run_dir.exists()


def test_a_dry_run_of_a_submitting_target_without_a_cluster_says_why_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    target = _write(tmp_path, _submit("templates/training-jobset.yaml"))
    run_dir = tmp_path / "run"
    experiment = REPO / "experiments" / "kill-rank.yaml"
    argv = ["chaos", "run", str(experiment), "--dry-run", "--target", str(target)]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--run-dir", str(run_dir)])
    out = capsys.readouterr()
    assert exited.value.code == 2, out  # --target could not be resolved: the plan says so
    assert "kill_rank" in out.out and "could not be resolved" in out.out + out.err
    assert "Traceback" not in out.out + out.err
    assert not run_dir.exists()
