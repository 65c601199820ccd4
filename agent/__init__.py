"""stormwatch.agent."""
