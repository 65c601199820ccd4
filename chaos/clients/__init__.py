"""The node agents' HTTP client (aiohttp): ``/healthz``, ``/v1/ranks`` and the fault API.

Only the controller talks to the agents' fault API, so this client lives here; it sends
its requests through the shared plumbing of :mod:`stormwatch.clients.http` (one request
helper, one error mapping), as the Prometheus and responder clients
(:mod:`stormwatch.clients`) do. JSON is converted to models at this boundary, and transport
or HTTP errors become :class:`~stormwatch.chaos.errors.ServiceError` (or
:class:`~stormwatch.chaos.errors.FaultError` for a refused fault).
"""

from stormwatch.chaos.clients.agent import AgentClient, AgentRank

__all__ = ["AgentClient", "AgentRank"]
