"""The lab's long-running services: what they are and how they are configured
(:mod:`.definitions`), how they are started and stopped (:mod:`.procs`, with the detached
:mod:`.supervise` script), and their readiness checks (:mod:`.health`)."""
