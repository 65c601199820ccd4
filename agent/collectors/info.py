"""``info`` collector: the agent's own identity and tracing health."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import Metric

import stormwatch
from stormwatch.agent.collectors.base import new_family


class InfoCollector:
    """``stormwatch_agent_info{node,version,gpu_backend}`` (always 1) and
    ``stormwatch_agent_spans_total{outcome}`` (the agent's span exports by outcome).

    Args:
        node: this agent's node name.
        backend: the GPU backend in use (``nvml``, ``sim``, ``none``).
        span_counts: returns span exports per outcome (:meth:`AgentTracing.counts
            <stormwatch.agent.tracing.AgentTracing.counts>`).
    """

    def __init__(
        self, node: str, backend: str, span_counts: Callable[[], Mapping[str, int]]
    ) -> None:
        self._node, self._backend, self._span_counts = node, backend, span_counts

    def collect(self) -> Iterator[Metric]:
        info = new_family("stormwatch_agent_info")
        info.add_metric([self._node, stormwatch.__version__, self._backend], 1.0)
        spans = new_family("stormwatch_agent_spans_total")
        for outcome, n in sorted(self._span_counts().items()):
            spans.add_metric([outcome], float(n))
        yield from (info, spans)


__all__ = ["InfoCollector"]
