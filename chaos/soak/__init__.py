"""Soaks: one fault-free job on the lab, disturbed only as operators and schedulers do every
day (checkpoints, evaluation pauses, a planned restart, an elastic resize), and every alert
that fired meanwhile: the target is zero (``stormwatch chaos soak``, ``make soak``;
docs/chaos-suite.md, "Soak").

- :mod:`.settings`: the plan (:class:`SoakSettings`: length, cadences, when each event comes);
- :mod:`.job`: the job and what the soak asks of the lab (:class:`LabSoak`), rank 0's log;
- :mod:`.runner`: runs a soak (:class:`SoakRunner`);
- :mod:`.counting`: the alerts of the window from Prometheus range results, each placed
  against the nearest event;
- :mod:`.report`: ``soak.json`` (:class:`SoakReport`) and ``soak.md``.
"""

from stormwatch.chaos.soak.report import SoakReport, load_report, write_report
from stormwatch.chaos.soak.runner import SoakRunner
from stormwatch.chaos.soak.settings import SoakSettings

__all__ = ["SoakReport", "SoakRunner", "SoakSettings", "load_report", "write_report"]
