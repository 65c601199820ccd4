"""stormwatch: observability and chaos testing for GPU training clusters.

This top-level package is the small shared home: the CLI root
(:mod:`stormwatch.cli`), the root of the exception tree (:mod:`stormwatch.errors`),
and what several components share, written once: :mod:`stormwatch.clients` (one
client per service: the Prometheus HTTP API, the responder), :mod:`stormwatch.contracts`
(the responder's records, a rank's environment), :mod:`stormwatch.otel` (the one
OpenTelemetry set-up), :mod:`stormwatch.sqlite` (the one SQLite helper) and
:mod:`stormwatch.platforms` (the lab, Kubernetes and Slurm backends). Each component
installs as its own sub-package:

- :mod:`stormwatch.agent`: per-node agent (metrics, rank watcher, fault API)
- :mod:`stormwatch.trainer`: reference FSDP2 x TP trainer (system under test)
- :mod:`stormwatch.chaos`: experiments, faults, ledger, the local lab, post-mortems
- :mod:`stormwatch.alerts`: Prometheus rules, Alertmanager config, responder
- :mod:`stormwatch.dashboards`: Grafana dashboards as code
"""

from stormwatch.errors import ConfigError, StormwatchError

__all__ = ["ConfigError", "StormwatchError", "__version__"]
__version__ = "0.1.0"
