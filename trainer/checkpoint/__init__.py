"""Distributed checkpoints that survive a crash mid-save: the checkpointer (:mod:`.checkpointer`),
what a checkpoint holds and how a rank's state is restored from it (:mod:`.state`), the on-disk
layout and completeness rules (:mod:`.store`), and how many failed saves in a row a job trains
through (:mod:`.budget`)."""
