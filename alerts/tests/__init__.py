"""Data package: promtool unit tests (``*.yml``) of the shipped rules; see ``stormwatch alerts check``."""
