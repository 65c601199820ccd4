"""stormwatch.dashboards: Grafana dashboards as code.

Not built yet: the dashboards (grafana-foundation-sdk) and their push through
grafana-client are tracked as their own issue. The package exists so the
layout and the wheel already carry it.
"""

__all__: list[str] = []
