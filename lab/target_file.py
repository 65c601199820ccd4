"""The lab's target file, ``<run-dir>/target.yaml``: the lab described as a cluster.

What ``lab up`` writes (before the services start: the responder reads it, ``alerts serve
--target``), by the lab's scheduler (:attr:`LabConfig.job_scheduler`):

* ``slurm`` (the default): a ``slurm`` target of the lab's own cluster, as a user would
  describe theirs (docs/deploy-slurm.md, "Run game days on your cluster"): ``slurm:`` with
  the lab's ``slurm.conf``, ``nproc_per_node`` and the trainer's control directory the
  recipe's ranks read (``STORMWATCH_CONTROL_DIR`` = ``<run>/nodes/%n/metrics/control``,
  ``%n`` the node: ``{node}``, rank 0's node, in the pattern); ``prometheus``; ``agents``
  (their ports, ``host: "{addr}"``: Slurm's ``NodeAddr``, the node's namespace address,
  reachable from the root namespace); ``credentials`` (the agents' token, the responder's
  URL and token); and the ``lab:`` section (run directory, nodes with their metrics
  directories, ranks per node) that says this cluster is a stormwatch lab: chaos starts
  its experiment jobs through the lab (``Lab.start_job``, ``sbatch``) and readers take
  lab-only facts from it (:func:`stormwatch.platforms.read_lab_target`). No ``job:``.
  ``grace_period_s`` is the lab's (:attr:`LabConfig.grace_period_s`, its ``KillWait``).
* ``direct``: a ``lab`` target (:func:`~stormwatch.platforms.targets.lab_target_file`): the
  responder's backend is then the lab's processes.

Without a lab state (no ``lab.json`` yet) it is the minimal ``lab`` target naming the run
directory, which the chaos commands answer with the lab's own "no lab.json".
"""

from __future__ import annotations

from stormwatch.lab.paths import RunPaths
from stormwatch.lab.slurm.lab_cluster import cluster_config
from stormwatch.lab.state import LabState
from stormwatch.platforms.targets import (
    AgentsSection,
    CredentialsSection,
    PrometheusSection,
    SlurmSettings,
    TargetFile,
    dump_target_file,
    lab_section,
    lab_target_file,
)

#: The first line of the file ``lab up`` writes.
HEADER = "# written by `stormwatch lab up`\n"


def lab_target(paths: RunPaths, state: LabState | None) -> TargetFile:
    """The lab's target file (module docstring) for ``state`` (None: the minimal one).

    Raises:
        pydantic.ValidationError: a value is not valid (the token files must exist for
            a ``slurm`` target: :meth:`~stormwatch.lab.builder.LabBuilder.write_secrets`).
    """
    if state is None:
        return lab_target_file(paths.run_dir)
    config = state.config
    nodes = {n.name: n.metrics_dir for n in state.nodes}
    if config.job_scheduler != "slurm":
        return lab_target_file(
            paths.run_dir,
            prometheus_url=state.prometheus_url,
            nodes=nodes,
            nproc_per_node=config.nproc_per_node,
            grace_period_s=config.grace_period_s,
        )
    slurm = SlurmSettings(
        nproc_per_node=config.nproc_per_node,
        # What lab.jobs.slurmjob exports as STORMWATCH_CONTROL_DIR, "%n" -> "{node}".
        control_dir=str(paths.node_metrics("{node}") / "control"),
        conf=cluster_config(paths.run_dir, config).paths.slurm_conf,
    )
    return TargetFile(
        platform="slurm",
        grace_period_s=config.grace_period_s,
        prometheus=PrometheusSection(url=state.prometheus_url) if state.prometheus_url else None,
        agents=AgentsSection(
            port=config.agent_port, fault_port=config.agent_fault_port, host="{addr}"
        ),
        credentials=CredentialsSection(
            agent_token_file=state.agent_token_file,
            responder_url=state.responder_url,
            responder_token_file=state.responder_token_file,
        ),
        slurm=slurm,
        lab=lab_section(paths.run_dir, nodes=nodes, nproc_per_node=config.nproc_per_node),
    )


def write_target_file(paths: RunPaths, state: LabState | None) -> None:
    """Write :func:`lab_target` to ``<run-dir>/target.yaml`` atomically (a temporary file
    renamed over it), so a reader never sees half a file.

    Raises:
        pydantic.ValidationError: see :func:`lab_target`.
        OSError: the run directory cannot be written.
    """
    text = HEADER + dump_target_file(lab_target(paths, state))
    tmp = paths.target_file.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(paths.target_file)


__all__ = ["HEADER", "lab_target", "write_target_file"]
