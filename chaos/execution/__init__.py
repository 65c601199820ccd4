"""Running an experiment: one :class:`~.runner.Runner` per run, with explicit collaborators.

- :mod:`.runner`: orders the phases, decides the verdict, builds the collaborators;
- :mod:`.context`: what they share (experiment, id, journal writer, reporter, annotations);
- :mod:`.lifecycle`: the job (start or attach, warm-up, end); :mod:`.readiness`: pre-flight;
- :mod:`.checks`: journaled probes and the steady-state hypothesis (:mod:`.probes` evaluates);
- :mod:`.method`: the method; :mod:`.injector`: sends a fault (wait for the step, ledger first,
  then send) and :mod:`.injection`: where a fault goes and how it is applied there, by its
  kind's placement trait from :mod:`stormwatch.faults` (reverting is :mod:`stormwatch.chaos.ledger`);
  :mod:`.safeguards`: stops the method when a safeguard trips;
- :mod:`.tracker`: the run's faults; :mod:`.rollback`: recovery, rollbacks, final revert;
- :mod:`.journal`: the journal and its writer; :mod:`.tracing`: its spans;
- :mod:`.dryrun`: ``--dry-run``; :mod:`.ids`: run and job names; :mod:`.reporter`: progress.
"""
