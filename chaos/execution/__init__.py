"""Running an experiment: one :class:`~.runner.Runner` per run, with explicit collaborators.

- :mod:`.runner`: orders the phases, decides the verdict, builds the collaborators;
- :mod:`.context`: what they share (experiment, id, journal writer, reporter, annotations);
  :mod:`.ids`: run and job names; :mod:`.reporter`: the progress protocol;
- :mod:`.lifecycle`: the job (start or attach, warm-up, end); :mod:`.readiness`: pre-flight;
- :mod:`.checks`: journaled probes and the steady-state hypothesis (:mod:`.probes` evaluates);
- :mod:`.method`: the method; :mod:`.safeguards`: stops the method when a safeguard trips;
- :mod:`.injection`: injecting the faults (:mod:`.injection.injector`: wait for the step,
  ledger first, then send; :mod:`.injection.placement`: where a fault goes and how it is
  applied there, by its kind's placement trait from :mod:`stormwatch.faults`) and the run's
  view of them (:mod:`.injection.tracker`); reverting is :mod:`stormwatch.chaos.ledger`;
- :mod:`.rollback`: recovery, rollbacks, final revert;
- :mod:`.journal`: the journal, :mod:`.journal_writer`: its writer; :mod:`.tracing`: its spans.

The dry run (``--dry-run``: the plan, targets resolved, nothing run) belongs to the
experiment language: :mod:`stormwatch.chaos.experiment.dryrun`.
"""
