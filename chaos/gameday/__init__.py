"""chaos/gameday."""
