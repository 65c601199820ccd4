"""HTTP clients (aiohttp) for the node agents and the responder.

Prometheus is queried with the lab's :class:`stormwatch.lab.AsyncPrometheusClient`.

Each is a thin typed seam: JSON is converted to models at this boundary, and
transport or HTTP errors become :class:`~stormwatch.chaos.errors.ServiceError`
(or :class:`~stormwatch.chaos.errors.FaultError` for a refused fault).
"""

from stormwatch.chaos.clients.agent import AgentClient, AgentRank
from stormwatch.chaos.clients.responder import Action, Incident, Notification, ResponderClient

__all__ = [
    "Action",
    "AgentClient",
    "AgentRank",
    "Incident",
    "Notification",
    "ResponderClient",
]
