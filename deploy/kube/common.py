"""What every generated object shares: the namespace, image, labels, ports and ``meta``.

Ports come from the code's defaults (the agent's ``AgentConfig``, the responder's
``ResponderSettings``), never copied by hand.
"""

from __future__ import annotations

import posixpath
from typing import Any

from stormwatch.agent.config import AgentConfig
from stormwatch.agent.kube.podresources import DEFAULT_SOCKET
from stormwatch.alerts.responder.settings import ResponderSettings
from stormwatch.platforms.targets import DEFAULT_AGENT_PORT

Obj = dict[str, Any]

NAMESPACE = "stormwatch"
#: The full image (trainer, responder; deploy/docker/Dockerfile's default target).
IMAGE = "ghcr.io/stormwatch/stormwatch:0.1.0"
#: The agent's slim image (stormwatch[agent], no torch; the Dockerfile's ``agent`` target).
AGENT_IMAGE = "ghcr.io/stormwatch/stormwatch-agent:0.1.0"
PART_OF = {"app.kubernetes.io/part-of": "stormwatch"}
AGENT_LABELS = {"app.kubernetes.io/name": "stormwatch-agent", **PART_OF}
RESPONDER_LABELS = {"app.kubernetes.io/name": "stormwatch-responder", **PART_OF}
#: Host folder the training pods and the agent share (the ranks' STORMWATCH_METRICS_DIR).
METRICS_HOST_DIR = "/run/stormwatch/metrics"
#: The kubelet's pod-resources socket, where the kubelet puts it by default (the agent's
#: ``--pod-resources-socket``: GPU series get namespace, pod and container), and the host
#: folder holding it, mounted read-only at the same path in the agent's container.
POD_RESOURCES_SOCKET = DEFAULT_SOCKET
POD_RESOURCES_DIR = posixpath.dirname(DEFAULT_SOCKET)
#: Label whose value is the training job's name (the responder's job label).
JOB_LABEL = "stormwatch.io/job"
TOKEN_SECRET = "stormwatch-responder-token"
RESPONDER_SA = "stormwatch-responder"

#: The rank rules' 20 s "just exited" window needs at least 4 scrapes (alerts/rules/ranks.yml).
SCRAPE_INTERVAL = "5s"

_AGENT_DEFAULTS = AgentConfig.model_fields
AGENT_PORT: int = _AGENT_DEFAULTS["listen_port"].default
#: The DaemonSet's agent is on the host network (the proc connector exists in the host's network
#: namespace only), where 9400 is dcgm-exporter's port: it listens where the Slurm recipe's
#: does, 9402 (the fault API on 9403 in the dev overlay).
HOST_AGENT_PORT: int = DEFAULT_AGENT_PORT
FAULT_API_PORT: int = _AGENT_DEFAULTS["fault_listen_port"].default
RESPONDER_PORT: int = ResponderSettings.__dataclass_fields__["port"].default


def meta(name: str, labels: dict[str, str], namespace: str | None = NAMESPACE) -> Obj:
    out: Obj = {"name": name}
    if namespace:
        out["namespace"] = namespace
    out["labels"] = dict(labels)
    return out
