"""stormwatch.alerts."""
