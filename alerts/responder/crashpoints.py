"""Test-only crash points of the responder: where a SIGKILL hurts exactly-once most.

``STORMWATCH_RESPONDER_CRASH_AT=<point>:<kind>`` in the responder's environment makes it
SIGKILL itself when an action of ``kind`` reaches ``point``:

* ``started``: the action's ``started`` audit entry is written, the action has not run;
* ``outcome``: the action has run; its outcome entry and final status are not written
  (the two are one transaction, :meth:`~stormwatch.alerts.responder.store.Store.finish_action`).

The crash tests (``tests/alerts/test_exactly_once.py``) stop a real responder there,
start it again without the variable and check that each action is audited once and run
at most once. Never set it outside tests: the responder kills itself. It is read once,
when the responder is built (:meth:`CrashPoints.from_env`), never at import time.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from stormwatch.errors import ConfigError

log = logging.getLogger(__name__)

#: The environment variable, ``<point>:<kind>``.
CRASH_AT_ENV = "STORMWATCH_RESPONDER_CRASH_AT"
#: The points an action passes, in order.
CRASH_POINTS = ("started", "outcome")


@dataclass(frozen=True)
class CrashPoints:
    """Where to SIGKILL the responder (nowhere by default).

    Attributes:
        point: one of :data:`CRASH_POINTS`, or None.
        kind: the action kind that triggers it.
    """

    point: str | None = None
    kind: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CrashPoints:
        """Read :data:`CRASH_AT_ENV` (unset or empty: no crash point).

        Raises:
            ConfigError: the value is not ``<point>:<kind>`` with a known point.
        """
        value = (os.environ if environ is None else environ).get(CRASH_AT_ENV, "")
        if not value:
            return cls()
        point, _, kind = value.partition(":")
        if point not in CRASH_POINTS or not kind:
            raise ConfigError(
                f"{CRASH_AT_ENV}={value!r}: expected <point>:<kind> with point one of "
                f"{', '.join(CRASH_POINTS)} (a test-only hook; unset it)"
            )
        return cls(point, kind)

    def reach(self, point: str, kind: str) -> None:
        """SIGKILL this process when ``point`` and ``kind`` are the configured ones."""
        if (point, kind) == (self.point, self.kind):
            log.warning("%s: SIGKILL at %s of a %s action", CRASH_AT_ENV, point, kind)
            os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["CRASH_AT_ENV", "CRASH_POINTS", "CrashPoints"]
