"""The local lab: a small GPU-less training cluster in network namespaces on one machine.

::

    from stormwatch.lab import Lab, LabConfig, JobSpec
    lab = Lab("run")
    lab.up(LabConfig(nodes=3, nproc_per_node=2))    # Slurm over 3 nodes: a job's 2 + a spare
    lab.start_job(JobSpec(name="baseline", steps=60))  # sbatch deploy/slurm/train.sbatch
    lab.wait_job("baseline", timeout=600)
    lab.down()

Exceptions (all :class:`stormwatch.errors.StormwatchError`)::

    LabError                        the lab could not come up / be inspected / go down
    ├── LabPermissionError          not root (also a ConfigError)
    ├── PortInUseError              a root-namespace port is taken (also a ConfigError)
    ├── LabNotUpError               no lab in the run directory (ConfigError)
    │   └── LabNotFoundError        down: nothing of a lab in the run dir
    ├── LabOwnedElsewhereError      the prefix belongs to a lab in another run dir (ConfigError)
    ├── ServiceFailedError          a service exited or stayed unhealthy (.service, .log_file)
    ├── SlurmError                  the Slurm cluster: a tool missing, munge, a survivor of stop
    ├── JobError                    a job could not be started, found or stopped
    │   └── JobTimeoutError         wait_job gave up
    ConfigError                     invalid LabConfig / JobSpec field (names the field)

Modules: :mod:`.config` (LabConfig, JobSpec), :mod:`.state` (lab.json), :mod:`.paths`
(where things live in the run dir), :mod:`.lab` (Lab), :mod:`.preflight` (checks before
``up``), :mod:`.builder` (creates its network and services), :mod:`.teardown` (removes
them), :mod:`.registry` (which run dir owns a prefix), :mod:`.netns` (network seam),
:mod:`.progress` (``up``/``down`` events), :mod:`.services` (commands and configs,
detached processes, health, the responder's lab policy), :mod:`.slurm` (the lab's Slurm cluster: munge, slurmctld, one
slurmd per node namespace), :mod:`.jobs` (torchrun across
namespaces: command lines, launching, elastic jobs; :mod:`.jobs.slurmjob`: jobs through
Slurm), :mod:`.status`, :mod:`.cli`
(``stormwatch lab``; the root command passes it :class:`~.cli.LabHooks`).
The lab's Prometheus is queried with :class:`stormwatch.clients.PrometheusClient`
(:meth:`Lab.prometheus`); its errors are :class:`stormwatch.clients.PrometheusAPIError`.
"""

from stormwatch.lab.config import JobSpec, LabConfig
from stormwatch.lab.errors import (
    JobError,
    JobTimeoutError,
    LabError,
    LabNotFoundError,
    LabNotUpError,
    LabOwnedElsewhereError,
    LabPermissionError,
    PortInUseError,
    ServiceFailedError,
    SlurmError,
)
from stormwatch.lab.lab import Lab
from stormwatch.lab.netns import IpRoute2, NetworkLayer
from stormwatch.lab.progress import ProgressEvent
from stormwatch.lab.state import (
    JobInfo,
    JobResult,
    LabState,
    NodeState,
    ProcessRecord,
)
from stormwatch.lab.status import LabStatus

__all__ = [
    "IpRoute2",
    "JobError",
    "JobInfo",
    "JobResult",
    "JobSpec",
    "JobTimeoutError",
    "Lab",
    "LabConfig",
    "LabError",
    "LabNotFoundError",
    "LabNotUpError",
    "LabOwnedElsewhereError",
    "LabPermissionError",
    "LabState",
    "LabStatus",
    "NetworkLayer",
    "NodeState",
    "PortInUseError",
    "ProcessRecord",
    "ProgressEvent",
    "ServiceFailedError",
    "SlurmError",
]
