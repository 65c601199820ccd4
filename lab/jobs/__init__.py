"""Training jobs in the lab: one torchrun per node namespace, joined over the lab bridge.

* :mod:`.torchrun`: the command line and environment of one node's torchrun (what
  torchrun needs across network namespaces);
* :mod:`.launch`: start, watch, stop a job (and rejoin or relaunch an elastic one);
* :mod:`.elastic`: elastic jobs' rendezvous settings, global batch and FC-09's terminal state.
"""
