"""A :class:`~.api.KubeApi` that answers from recorded API bodies (the backend's test double).

Each answer is a file in one folder: a JSON body exactly as the API server sends it
(a ``PodList``, a ``Node``, a ``Job``, a JobSet, or a ``Status``), or a ``.log`` text
file (a pod log). A ``Status`` whose ``status`` is ``Failure`` is raised as the
client's ``ApiException`` (its ``code``, ``reason`` and the body, as the client
does); any other body is deserialised with the client's own
``ApiClient.deserialize`` into the model the real call returns, so a body the client
cannot read fails here as it would against a cluster.

Requests are named by their HTTP method and path, as the API documents them and
``kubectl -v=6`` prints them (query left unencoded), for example
``GET /api/v1/namespaces/training/pods?labelSelector=stormwatch.io/job=llm``.
:meth:`RecordedKubeApi.answer` queues the files for one request; successive calls
get successive files and the last one repeats (a list read back after an action).
Every request is kept in :attr:`RecordedKubeApi.calls` with the body it sent, as
the client would serialise it.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from stormwatch.platforms.kubernetes.api import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION

_JOBSETS = f"/apis/{JOBSET_GROUP}/{JOBSET_VERSION}/namespaces/{{ns}}/{JOBSET_PLURAL}"


class RecordedKubeApi:
    """:class:`~.api.KubeApi` from recorded bodies in ``folder`` (module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.calls: list[tuple[str, Any]] = []
        self._answers: dict[str, deque[str]] = {}
        self._client = k8s.ApiClient()

    def answer(self, request: str, *files: str) -> RecordedKubeApi:
        """Answer ``request`` (``"GET /api/v1/..."``) with ``files`` in turn, the last repeating.

        Raises:
            FileNotFoundError: a file is not in the folder.
        """
        for name in files:
            if not (self.folder / name).is_file():
                raise FileNotFoundError(f"no recording {name} in {self.folder}")
        self._answers[request] = deque(files)
        return self

    def requests(self, method: str = "") -> list[str]:
        """The request lines made so far (only ``method`` ones when given)."""
        return [line for line, _ in self.calls if line.startswith(method)]

    def _reply(self, request: str, sent: Any, model: str) -> Any:
        self.calls.append(
            (request, None if sent is None else self._client.sanitize_for_serialization(sent))
        )
        queue = self._answers.get(request)
        if not queue:
            raise LookupError(f"no recorded answer for {request}")
        name = queue.popleft() if len(queue) > 1 else queue[0]
        text = (self.folder / name).read_text(encoding="utf-8")
        if name.endswith(".log"):
            return text
        data = json.loads(text)
        if data.get("kind") == "Status" and data.get("status") == "Failure":
            raise ApiException(status=data.get("code"), reason=data.get("reason"), body=text)
        if model == "object":
            return data
        return self._client.deserialize(text, model, "application/json")

    def list_pods(
        self, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> k8s.V1PodList:
        query = "&".join(
            f"{key}={value}"
            for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))
            if value
        )
        path = f"/api/v1/namespaces/{namespace}/pods" + (f"?{query}" if query else "")
        return self._reply(f"GET {path}", None, "V1PodList")

    def list_all_pods(self, *, field_selector: str) -> k8s.V1PodList:
        path = f"/api/v1/pods?fieldSelector={field_selector}"
        return self._reply(f"GET {path}", None, "V1PodList")

    def delete_pod(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        self._reply(f"DELETE /api/v1/namespaces/{namespace}/pods/{name}", body, "V1Pod")

    def evict_pod(self, name: str, namespace: str, body: k8s.V1Eviction) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        self._reply(f"POST {path}", body, "V1Status")

    def read_pod_log(self, name: str, namespace: str, *, tail_lines: int) -> str:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/log?tailLines={tail_lines}"
        return str(self._reply(f"GET {path}", None, "str"))

    def list_events(self, namespace: str) -> k8s.CoreV1EventList:
        path = f"/api/v1/namespaces/{namespace}/events"
        return self._reply(f"GET {path}", None, "CoreV1EventList")

    def read_node(self, name: str) -> k8s.V1Node:
        return self._reply(f"GET /api/v1/nodes/{name}", None, "V1Node")

    def patch_node(self, name: str, body: k8s.V1Node) -> k8s.V1Node:
        return self._reply(f"PATCH /api/v1/nodes/{name}", body, "V1Node")

    def read_job(self, name: str, namespace: str) -> k8s.V1Job:
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        return self._reply(f"GET {path}", None, "V1Job")

    def create_job(self, namespace: str, body: k8s.V1Job) -> k8s.V1Job:
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        return self._reply(f"POST {path}", body, "V1Job")

    def delete_job(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        self._reply(f"DELETE {path}", body, "V1Status")

    def read_jobset(self, name: str, namespace: str) -> dict[str, Any]:
        path = _JOBSETS.format(ns=namespace) + f"/{name}"
        return dict(self._reply(f"GET {path}", None, "object"))

    def create_jobset(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        path = _JOBSETS.format(ns=namespace)
        return dict(self._reply(f"POST {path}", body, "object"))

    def delete_jobset(self, name: str, namespace: str, body: k8s.V1DeleteOptions) -> None:
        path = _JOBSETS.format(ns=namespace) + f"/{name}"
        self._reply(f"DELETE {path}", body, "object")


__all__ = ["RecordedKubeApi"]
