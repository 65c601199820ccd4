"""chaos/experiment."""
