"""Training data: the corpus (:mod:`.corpus`) and deterministic, data-parallel batches
(:mod:`.batches`)."""
