"""Game days: running experiments as a drill and scoring how the system answered.

- :mod:`.suite`: ``stormwatch chaos suite``: every experiment of a folder, one after another;
- :mod:`.scorecard`: the suite's scorecard (per fault: detected, alert, times, verdict);
- :mod:`.baseline`: the fault-free baseline an experiment's loss is compared to;
- :mod:`.demo`: ``stormwatch demo``: lab, baseline, kill-rank experiment, post-mortem.
"""
