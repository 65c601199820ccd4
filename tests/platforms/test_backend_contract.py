"""Every platform backend keeps the same contract: the methods and signatures of
``PlatformBackend``, the same placement for the same job, one line per action, and
``BackendError`` with the same wording for a missing job or node.

One job ``llm`` of 4 ranks on nodes node-a (ranks 0, 1) and node-b (ranks 2, 3) on each
platform: the lab as real processes carrying the ranks' environment, Kubernetes as
two indexed-Job pods in recorded API responses, Slurm as one running job
behind a recorded command runner.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from stormwatch.platforms import (
    BACKEND_METHODS,
    BackendError,
    LabBackend,
    PlatformBackend,
)
from stormwatch.platforms.kubernetes import KubernetesBackend, RecordedKubeApi
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands
from stormwatch.platforms.slurm_readback import SlurmWait

PLACEMENT = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
BACKENDS = (LabBackend, KubernetesBackend, SlurmBackend)


def _k8s_api(running: bool) -> RecordedKubeApi:
    """Pods labelled stormwatch.io/job=llm (no Job or JobSet of that name) in namespace t,
    answered from recorded API bodies; each action's read-back sees the replacements."""
    api = RecordedKubeApi(Path(__file__).parent / "recordings" / "kubernetes")
    api.answer("GET /apis/batch/v1/namespaces/t/jobs/llm", "contract-status-404-job.json")
    api.answer(
        "GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/t/jobsets/llm",
        "status-404-no-jobset-crd.json",
    )
    pods = "GET /api/v1/namespaces/t/pods?labelSelector=stormwatch.io/job=llm"
    if not running:
        return api.answer(pods, "pods-llm-none.json")
    # found, restart read-back, found, exclude read-back (then the last repeats)
    api.answer(
        pods,
        "contract-pods-running.json",
        "contract-pods-restarted.json",
        "contract-pods-restarted.json",
        "contract-pods-excluded.json",
    )
    for name in ("llm-0-aaaaa", "llm-1-bbbbb"):
        api.answer(f"DELETE /api/v1/namespaces/t/pods/{name}", "pod-llm-0-deleting.json")
    api.answer("PATCH /api/v1/nodes/node-b", "contract-node-b-cordoned.json")
    api.answer("GET /api/v1/nodes/node-b", "contract-node-b-cordoned.json")
    api.answer("POST /api/v1/namespaces/t/pods/llm-1-ddddd/eviction", "status-201-eviction.json")
    for name in ("llm-0-ccccc", "llm-1-eeeee"):
        api.answer(f"GET /api/v1/namespaces/t/pods/{name}/log?tailLines=200", "llm-1.log")
    api.answer("GET /api/v1/namespaces/t/events", "contract-events.json")
    return api


def _slurm_runner(running: bool) -> Callable[[Sequence[str]], str]:
    """Job 77 (``llm``) on node-a and node-b, node-c spare: a requeue is PENDING at once,
    a ``StartTime`` update runs it on the first two nodes neither drained nor excluded."""
    job = {"state": "RUNNING" if running else "", "nodes": "node-[a-b]", "restarts": 0}
    drained: dict[str, str] = {}
    hosts = {"node-[a-b]": "node-a\nnode-b\n", "node-[a,c]": "node-a\nnode-c\n"}

    def run(argv: Sequence[str]) -> str:
        argv = list(argv)
        if argv[0] == "squeue" and "--name=llm" in argv:
            return f"77|{job['nodes']}\n" if job["state"] == "RUNNING" else ""
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return hosts[argv[3]]
        if argv[:3] == ["squeue", "--noheader", "--steps"]:
            return "77.batch\n" if job["state"] == "RUNNING" else ""
        if argv[:4] == ["scontrol", "--oneliner", "show", "job"]:
            return (
                f"JobId=77 JobName=llm JobState={job['state']} Restarts={job['restarts']} "
                f"NodeList={job['nodes'] or '(null)'}\n"
            )
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            node = argv[4]
            return f"NodeName={node} State=MIXED+DRAIN Reason={drained[node]} [root@x]\n"
        if argv[:2] == ["scontrol", "requeue"]:
            job.update(state="PENDING", nodes="", restarts=int(job["restarts"]) + 1)
        elif argv[:3] == ["scontrol", "update", "JobId=77"] and argv[3].startswith("StartTime="):
            free = [n for n in ("node-a", "node-b", "node-c") if n not in drained]
            lists = {("node-a", "node-b"): "node-[a-b]", ("node-a", "node-c"): "node-[a,c]"}
            job.update(state="RUNNING", nodes=lists[tuple(free[:2])])
        elif argv[:2] == ["scontrol", "update"] and argv[2].startswith("NodeName="):
            drained[argv[2].removeprefix("NodeName=")] = argv[4].removeprefix("Reason=")
        return ""

    return run


@pytest.fixture(params=["lab", "kubernetes", "slurm"])
def platform(
    request: pytest.FixtureRequest, tmp_path: Path, fake_job: Any, kit: Any
) -> Callable[[bool], PlatformBackend]:
    """``platform(running)`` -> a backend on which job ``llm`` runs (or nothing runs)."""
    diag = tmp_path / "diag"
    control = tmp_path / "shared" / "control"

    def make(running: bool) -> PlatformBackend:
        if request.param == "lab":
            nodes = {n: tmp_path / n / "metrics" for n in ("node-a", "node-b")}
            for path in nodes.values():
                path.mkdir(parents=True, exist_ok=True)
            backend = LabBackend(diagnostics_dir=diag, node_metrics_dirs=nodes, grace_period_s=1)
            if running:  # torchrun's stand-ins start a killed worker again
                fake_job("llm", nodes["node-a"], workers=2, first_rank=0, respawn=True)
                fake_job("llm", nodes["node-b"], workers=2, first_rank=2, respawn=True)
                kit.wait_for(lambda: len(backend.workers("llm")) == 4, 20, "4 workers")
            return backend
        if request.param == "kubernetes":
            return KubernetesBackend(
                api=_k8s_api(running),
                namespace="t",
                diagnostics_dir=diag,
                control_dir=control,
                sleep=lambda s: None,
            )
        return SlurmBackend(
            diagnostics_dir=diag,
            nproc_per_node=2,
            control_dir=str(control),
            commands=SlurmCommands(runner=_slurm_runner(running)),
            wait=SlurmWait(timeout_s=1.0, poll_s=0.001),
        )

    return make


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("method", BACKEND_METHODS)
def test_each_backend_has_the_protocols_method_with_its_signature(
    backend: type, method: str
) -> None:
    expected = inspect.signature(getattr(PlatformBackend, method))
    actual = inspect.signature(getattr(backend, method))
    assert list(actual.parameters) == list(expected.parameters)
    hints = get_type_hints(getattr(backend, method))
    wanted = get_type_hints(getattr(PlatformBackend, method))
    for name, hint in wanted.items():
        if name == "return" and method == "ranks":
            assert hints["return"] == dict[int, str]  # a Mapping[int, str]
        else:
            assert hints[name] == hint, f"{backend.__name__}.{method}: {name}"


def test_the_protocol_lists_exactly_the_contract_methods() -> None:
    declared = [
        name
        for name, value in vars(PlatformBackend).items()
        if callable(value) and not name.startswith("_")
    ]
    assert sorted(declared) == sorted(BACKEND_METHODS)


def test_every_backend_places_the_same_job_the_same_way(
    platform: Callable[[bool], PlatformBackend],
) -> None:
    backend = platform(True)
    assert isinstance(backend, PlatformBackend)
    assert dict(backend.ranks("llm")) == PLACEMENT


def test_every_action_answers_one_line_and_diagnostics_land_in_the_same_file(
    platform: Callable[[bool], PlatformBackend], tmp_path: Path, kit: Any
) -> None:
    backend = platform(True)
    # (action, the lab's live workers after it: a restart kills them, torchrun starts them
    # again; excluding node-b kills its torchrun too)
    for call, workers in (
        (lambda: backend.restart_workers("llm"), 4),
        (lambda: backend.exclude_node_and_restart("llm", "node-b"), 2),
        (lambda: backend.request_checkpoint("llm"), 2),
        (lambda: backend.collect_diagnostics("llm", 5), 2),
    ):
        detail = call()
        assert isinstance(detail, str) and detail and "\n" not in detail
        if isinstance(backend, LabBackend):
            kit.wait_for(lambda n=workers: len(backend.workers("llm")) == n, 20, "workers")
    report = json.loads((tmp_path / "diag" / "incident-5.json").read_text())
    assert report["job"] == "llm"


def test_every_backend_refuses_a_missing_job_with_the_same_error(
    platform: Callable[[bool], PlatformBackend],
) -> None:
    backend = platform(False)
    for call in (
        lambda: backend.ranks("llm"),
        lambda: backend.restart_workers("llm"),
        lambda: backend.exclude_node_and_restart("llm", "node-a"),
        lambda: backend.request_checkpoint("llm"),
        lambda: backend.collect_diagnostics("llm", 1),
    ):
        with pytest.raises(BackendError, match="no live worker of job 'llm'"):
            call()


def test_every_backend_refuses_a_node_the_job_is_not_on(
    platform: Callable[[bool], PlatformBackend],
) -> None:
    with pytest.raises(BackendError, match="job 'llm' has no live worker on node 'node-z'"):
        platform(True).exclude_node_and_restart("llm", "node-z")
