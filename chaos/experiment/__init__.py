"""The experiment language: :mod:`.model` (the typed experiment), :mod:`.providers` (probe
providers and tolerances), :mod:`.loader` (YAML to model, every problem with its field path and
line), :mod:`.semantics` (checks that span fields), :mod:`.selection` (targets, blast radius),
:mod:`.dryrun` (``--dry-run``: the plan an experiment would run, targets resolved)."""
