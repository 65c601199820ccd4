"""Data package: the shipped Prometheus rule files (``*.yml``); see :func:`stormwatch.alerts.rules_dir`."""
