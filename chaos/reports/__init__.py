"""chaos/reports."""
