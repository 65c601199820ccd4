"""chaos/execution."""
