"""stormwatch.chaos."""
