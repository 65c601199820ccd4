"""Training jobs: the example indexed Job (with its rendezvous Service and volume claim),
and the job templates a kubernetes target file submits (``job.submit``).

Each runs torchrun, one pod per node, c10d rendezvous on pod 0, with the labels and
environment the agent and the responder read (``STORMWATCH_JOB``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` from the completion index). The templates hold ``${NAME}``
placeholders (``stormwatch.platforms.kubernetes.render_template``): the run's
``${STORMWATCH_JOB}``, ``${STORMWATCH_STEPS}``, ``${STORMWATCH_CHECKPOINT_EVERY}`` and the
target file's ``${IMAGE}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kube.common import IMAGE, JOB_LABEL, METRICS_HOST_DIR, PART_OF, Obj
from stormwatch.platforms.kubernetes import COMPLETION_INDEX

#: torchrun's c10d rendezvous port on pod 0.
RDZV_PORT = 29500
#: The templates' shared prerequisites (examples/templates/prerequisites.yaml): the
#: headless Service the indexed Job template's pods resolve each other through, and the
#: volume claim holding checkpoints, rank logs and control files.
TEMPLATE_SERVICE = "stormwatch-train"
TEMPLATE_CLAIM = "stormwatch-shared"
#: Label that puts a templated Job's pods behind ``TEMPLATE_SERVICE``.
RDZV_LABEL = "stormwatch.io/rendezvous"


@dataclass(frozen=True)
class _Trainer:
    """What differs between the example job and the templates."""

    name: str
    rdzv_host: str
    claim: str
    image: str = IMAGE
    steps: str = "1000"
    checkpoint_every: str | None = None
    nodes: int = 2
    gpus_per_node: int = 8
    #: Folder on the shared volume for checkpoints/ and logs/ ("": the volume's root).
    folder: str = ""


def _container(run: _Trainer) -> Obj:
    every = [f"--checkpoint-every={run.checkpoint_every}"] if run.checkpoint_every else []
    return {
        "name": "trainer",
        "image": run.image,
        "command": ["torchrun"],
        "args": [
            f"--rdzv-endpoint={run.rdzv_host}:{RDZV_PORT}",
            "--rdzv-backend=c10d",
            f"--rdzv-id={run.name}",
            "--max-restarts=3",
            "--no-python",
            "stormwatch",
            "train",
            f"--steps={run.steps}",
            *every,
            f"--checkpoint-dir=/shared{run.folder}/checkpoints",
            f"--log-dir=/shared{run.folder}/logs",
        ],
        "env": [
            # torchrun reads its options from PET_*; the responder reads these two.
            {"name": "PET_NNODES", "value": str(run.nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(run.gpus_per_node)},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}
                },
            },
            {"name": "STORMWATCH_JOB", "value": run.name},
            # the node's name in the job attempt's records (stormwatch.telemetry.restarts)
            {"name": "STORMWATCH_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "STORMWATCH_METRICS_DIR", "value": METRICS_HOST_DIR},
            {"name": "STORMWATCH_CONTROL_DIR", "value": f"/shared/control/{run.name}"},
        ],
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(run.gpus_per_node)},
            "limits": {"memory": "64Gi", "nvidia.com/gpu": str(run.gpus_per_node)},
        },
        "volumeMounts": [
            {"name": "metrics", "mountPath": METRICS_HOST_DIR},
            {"name": "shared", "mountPath": "/shared"},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }


def _indexed_job_spec(run: _Trainer, labels: dict[str, str], subdomain: str | None) -> Obj:
    """An indexed Job's ``spec``: one pod per node; pods deleted or evicted by the
    responder are retried without counting against ``backoffLimit``."""
    pod: Obj = {"subdomain": subdomain} if subdomain else {}
    pod |= {
        "restartPolicy": "Never",
        "runtimeClassName": "nvidia",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [_container(run)],
        "volumes": [
            {
                "name": "metrics",
                "hostPath": {"path": METRICS_HOST_DIR, "type": "DirectoryOrCreate"},
            },
            {"name": "shared", "persistentVolumeClaim": {"claimName": run.claim}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        ],
    }
    return {
        "completionMode": "Indexed",
        "completions": run.nodes,
        "parallelism": run.nodes,
        "backoffLimit": 6,
        "podFailurePolicy": {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        },
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }


def _rendezvous_service(name: str, labels: dict[str, str], selector: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "clusterIP": "None",
            # Pod 0 must be resolvable before it is ready: it is the rendezvous host.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": "rdzv", "protocol": "TCP"}],
        },
    }


def _claim(name: str, labels: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }


def training_job(name: str = "train-demo", nodes: int = 2, gpus_per_node: int = 8) -> list[Obj]:
    """An indexed Job running torchrun (one pod per node, c10d rendezvous on pod 0 through a
    headless Service) with the labels and environment the agent and responder read."""
    labels = {JOB_LABEL: name, **PART_OF}
    run = _Trainer(
        name, f"{name}-0.{name}", f"{name}-shared", nodes=nodes, gpus_per_node=gpus_per_node
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": _indexed_job_spec(run, labels, subdomain=name),
    }
    service = _rendezvous_service(name, labels, {JOB_LABEL: name})
    return [service, _claim(f"{name}-shared", labels), job]


#: The run's job name in a template (``stormwatch.platforms.kubernetes.RUN_PARAMETERS``).
_JOB = "${STORMWATCH_JOB}"
#: Each run's checkpoints and rank logs in their own folder: a re-run never resumes another's.
_TEMPLATE_RUN = {
    "folder": f"/{_JOB}",
    "image": "${IMAGE}",
    "steps": "${STORMWATCH_STEPS}",
    "checkpoint_every": "${STORMWATCH_CHECKPOINT_EVERY}",
}


def template_prerequisites() -> list[Obj]:
    """What the templates use and do not create: the indexed Job template's rendezvous
    Service and the shared volume claim (``kubectl apply`` them once per namespace)."""
    return [
        _rendezvous_service(TEMPLATE_SERVICE, dict(PART_OF), {RDZV_LABEL: TEMPLATE_SERVICE}),
        _claim(TEMPLATE_CLAIM, dict(PART_OF)),
    ]


def job_template() -> list[Obj]:
    """An indexed Job named after the run; its pods resolve each other through the
    prerequisite Service ``stormwatch-train`` (hostnames ``<job>-<index>.stormwatch-train``)."""
    labels = {JOB_LABEL: _JOB, RDZV_LABEL: TEMPLATE_SERVICE, **PART_OF}
    run = _Trainer(_JOB, f"{_JOB}-0.{TEMPLATE_SERVICE}", TEMPLATE_CLAIM, **_TEMPLATE_RUN)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": _JOB, "labels": {JOB_LABEL: _JOB, **PART_OF}},
        "spec": _indexed_job_spec(run, labels, subdomain=TEMPLATE_SERVICE),
    }
    return [job]


def jobset_template() -> list[Obj]:
    """A JobSet named after the run: one replicated Job (an indexed Job, one pod per node);
    the JobSet controller makes the headless Service (``network.enableDNSHostnames``), so
    pod 0 is ``<job>-workers-0-0.<job>``."""
    labels = {JOB_LABEL: _JOB, **PART_OF}
    run = _Trainer(_JOB, f"{_JOB}-workers-0-0.{_JOB}", TEMPLATE_CLAIM, **_TEMPLATE_RUN)
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": _JOB, "labels": dict(labels)},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {"spec": _indexed_job_spec(run, labels, subdomain=None)},
                }
            ],
        },
    }
    return [jobset]
