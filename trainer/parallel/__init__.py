"""Parallelism of the reference trainer: the mesh owner (:mod:`.dims`), the one place that
applies PP, TP and FSDP2/HSDP (:mod:`.apply`), and the pipeline schedule (:mod:`.pipeline`)."""
