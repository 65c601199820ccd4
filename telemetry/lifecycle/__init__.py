"""The parts of a telemetry session (:mod:`stormwatch.telemetry`'s API is built on them):
:mod:`.session` (the :class:`~.session.Session`), :mod:`.launch` (placement and settings
from the launcher's environment), :mod:`.checks` (argument checks), :mod:`.guard` (one
warning per kind, never an exception), :mod:`.exits` (``atexit`` and SIGTERM, chained) and
:mod:`.hooks` (waiting for the process group; imports torch)."""
