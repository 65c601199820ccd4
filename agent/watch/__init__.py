"""Watching the ranks on this node: who they are, how they ended, whether they hang.

* :mod:`.ranks`: the rank watcher (torchrun agents and their workers, from ``/proc``).
* :mod:`.discovery`: finding this node's rank processes (process table, claims).
* :mod:`.procs`: process inspection (what makes a process a launcher or a rank).
* :mod:`.trainer_files`: reading the trainer's multiprocess files (per-rank samples,
  dead pids), for the watcher and the monitor.
* :mod:`.folder`: the multiprocess folder's one owner in the agent (lock, upkeep: folds,
  fresh starts, retention; file counts); :mod:`.fold`: the accumulator exited processes'
  files are folded into; :mod:`.merge`: exact sums and the exact merge of the files.
* :mod:`.proc_exits`: exit codes and killing signals from the Linux proc connector.
* :mod:`.detectors`: pure hang / straggler / collective-lag detectors.
* :mod:`.monitor`: drives the detectors from live data.
* :mod:`.diagnostics`: what is recorded about a job's ranks when one hangs.
* :mod:`.events`: the agent's rank event log (``<state-dir>/events.jsonl``, ``/v1/events``).
"""
