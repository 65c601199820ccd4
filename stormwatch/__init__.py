"""stormwatch: observability and chaos testing for GPU training clusters.

This top-level package is the small shared home: the CLI root
(:mod:`stormwatch.cli`), the root of the exception tree (:mod:`stormwatch.errors`),
and what several components share, written once: :mod:`stormwatch.clients` (one
client per service: the Prometheus HTTP API, the responder), :mod:`stormwatch.contracts`
(the responder's records, a rank's environment), :mod:`stormwatch.otel` (the one
OpenTelemetry set-up), :mod:`stormwatch.sqlite` (the one SQLite helper),
:mod:`stormwatch.yamltext` (settings files' YAML), :mod:`stormwatch.urls` (the
http(s) URL check) and :mod:`stormwatch.platforms` (the
lab, Kubernetes and Slurm backends). It imports no component (but the CLI root, lazily,
and the platforms, which may use the lab). Each component installs as its own sub-package:

- :mod:`stormwatch.faults`: every fault kind, declared once (shared by agent and controller)
- :mod:`stormwatch.agent`: per-node agent (metrics, rank watcher, fault API)
- :mod:`stormwatch.trainer`: reference PP x FSDP2/HSDP x DTensor TP trainer (system under test)
- :mod:`stormwatch.chaos`: experiments, fault ledger, post-mortems, game days
- :mod:`stormwatch.alerts`: Prometheus rules, Alertmanager config, responder
- :mod:`stormwatch.dashboards`: Grafana dashboards as code
- :mod:`stormwatch.lab`: the local cluster in network namespaces
- :mod:`stormwatch.plan`: resilience planning at scale
"""

from stormwatch.errors import ConfigError, StormwatchError

__all__ = ["ConfigError", "StormwatchError", "__version__"]
__version__ = "0.1.0"
