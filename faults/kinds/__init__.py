"""The fault kinds, one module per kind or small family (registered in
:mod:`stormwatch.faults.registry`).

* :mod:`.kill_rank`: ``kill_rank``;
* :mod:`.freeze_rank`: ``freeze_rank`` (controller-side);
* :mod:`.processes`: ``kill_torchrun``, ``kill_node_processes``, ``kill_rdzv_host``,
  ``kill_agent``, ``freeze_ranks``;
* :mod:`.network`: ``partition``, ``isolate_store``, ``packet_drop`` (iptables);
* :mod:`.link`: ``bandwidth_limit``, ``link_flap`` (tc, ip link);
* :mod:`.slowdown`: ``cpu_throttle``;
* :mod:`.trainer`: ``trainer_fault`` (the trainer's control file);
* :mod:`.gpu`: ``gpu_xid``, ``gpu_throttle``, ``nvlink_down``, ``nvlink_errors``,
  ``gpu_lost`` (simulated GPUs);
* :mod:`.gpu_power`: ``gpu_power_cap`` (NVML);
* :mod:`.storage`: ``checkpoint_readonly``, ``checkpoint_full`` (mounts).
"""
