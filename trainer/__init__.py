"""stormwatch.trainer."""
