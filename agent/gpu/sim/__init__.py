"""The simulated GPUs behind :class:`~stormwatch.agent.gpu.fake.FakeNvml`, one responsibility a module.

- :mod:`.devices`: each GPU's state (:class:`SimGpu`, :class:`SimLink`) and NVML's opaque handles
- :mod:`.calls`: every call counted, refused before ``nvmlInit``, failed as injected
  (any NVML error code, per function and per device) or because the GPU is lost
- :mod:`.readings`: sensor values as deterministic functions of time
- :mod:`.fields`: field values (ECC, retired pages, remapped rows, NVLink throughput and errors, ...)
- :mod:`.events`: XID events delivered to event sets
- :mod:`.gpm`: GPM samples and metrics
- :mod:`.mig`: MIG instances of a GPU in MIG mode and their handles
"""
