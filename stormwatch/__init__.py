"""stormwatch: observability and chaos testing for GPU training clusters.

This top-level package is the small shared home: the CLI root
(:mod:`stormwatch.cli`) and the root of the exception tree
(:mod:`stormwatch.errors`). Each component installs as its own sub-package:

- :mod:`stormwatch.agent`: per-node agent (metrics, rank watcher, fault API)
- :mod:`stormwatch.trainer`: reference FSDP2 x TP trainer (system under test)
- :mod:`stormwatch.chaos`: experiments, faults, ledger, the local lab, post-mortems
- :mod:`stormwatch.alerts`: Prometheus rules, Alertmanager config, responder
- :mod:`stormwatch.dashboards`: Grafana dashboards as code
"""

from stormwatch.errors import ConfigError, StormwatchError

__all__ = ["ConfigError", "StormwatchError", "__version__"]
__version__ = "0.1.0"
