"""Process-level setup: where this rank is (from torchrun's environment) and the process group.

:class:`RankEnv` is parsed from the environment once, at the CLI edge
(``torch`` is not imported for that). :func:`distributed` initialises and
tears down the default process group: NCCL (plus gloo for CPU tensors) when
CUDA is available, gloo otherwise. Outside torchrun (no ``WORLD_SIZE``) it
builds a one-rank group over an in-memory store, so ``stormwatch train``
runs as world size 1 without any network setup.

torchrun restarts: since torch 2.5 torchrun's c10d rendezvous shares its TCP
store with the workers, and the store outlives a restart, so a restarted
worker group may read the previous attempt's connection keys and fail
(pytorch/pytorch#135712). With a single torchrun agent the restart count is
the same on every worker, and :func:`distributed` prefixes the store with
it. With several agents the counts are node-local (a node restarted because
*another* node failed does not count it), so no consistent prefix exists:
launch torchrun with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a fresh store
per rendezvous round); the trainer warns when it sees the risky setup.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

from stormwatch.errors import ConfigError

log = logging.getLogger(__name__)

#: Collective timeout on CPU (gloo) and store timeout. A lost peer is
#: normally noticed by torchrun (it tears the worker group down within
#: seconds); this bounds the rest.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=5)
#: Collective timeout on GPU (NCCL): 2 minutes, long enough for a large
#: checkpoint's collectives, short enough that a stuck collective ends the
#: process well before a person notices (FC-10). ``--collective-timeout`` overrides.
GPU_COLLECTIVE_TIMEOUT = timedelta(minutes=2)


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """This process's place in the job.

    Attributes:
        rank: global rank (``RANK``).
        local_rank: rank on this node (``LOCAL_RANK``), selects the GPU.
        world_size: ranks in the job (``WORLD_SIZE``).
        attempt: restarts of this node's worker group so far
            (``TORCHELASTIC_RESTART_COUNT``; node-local, see :func:`distributed`).
        under_torchrun: False when none of the variables is set (a plain process).
        nodes: torchrun agents in the job (``GROUP_WORLD_SIZE``).
        max_restarts: ``TORCHELASTIC_MAX_RESTARTS``.
        agent_store: the workers share the agent's TCP store
            (``TORCHELASTIC_USE_AGENT_STORE=True``).
        master_addr: ``MASTER_ADDR`` (the store's host), if set.
        master_port: ``MASTER_PORT``, if set.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    attempt: int = 0
    under_torchrun: bool = False
    nodes: int = 1
    max_restarts: int = 0
    agent_store: bool = False
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv:
        """Parse torchrun's variables.

        Raises:
            ConfigError: a variable is set but is not a valid integer, or
                ``RANK`` is not below ``WORLD_SIZE``.
        """

        def number(name: str, default: int) -> int:
            raw = environ.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"environment {name}: not an integer ({raw!r})") from None
            if value < 0:
                raise ConfigError(f"environment {name}: must be >= 0 ({raw!r})")
            return value

        under = "WORLD_SIZE" in environ or "RANK" in environ
        env = cls(
            rank=number("RANK", 0),
            local_rank=number("LOCAL_RANK", 0),
            world_size=number("WORLD_SIZE", 1),
            attempt=number("TORCHELASTIC_RESTART_COUNT", 0),
            under_torchrun=under,
            nodes=number("GROUP_WORLD_SIZE", 1),
            max_restarts=number("TORCHELASTIC_MAX_RESTARTS", 0),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            master_addr=environ.get("MASTER_ADDR") or None,
            master_port=number("MASTER_PORT", 0) or None,
        )
        if env.world_size < 1 or env.rank >= env.world_size:
            raise ConfigError(
                f"environment RANK={env.rank} / WORLD_SIZE={env.world_size}: need 0 <= RANK < WORLD_SIZE"
            )
        return env


@contextlib.contextmanager
def distributed(env: RankEnv, *, timeout: timedelta | None = None) -> Iterator[str]:
    """Initialise the default process group for ``env``; yields the device type.

    Args:
        timeout: collective timeout of every process group (sub-groups of
            the mesh inherit it); a collective that does not complete within
            it raises (gloo) or aborts the communicator (NCCL). Default
            :data:`GPU_COLLECTIVE_TIMEOUT` on GPU, :data:`PROCESS_GROUP_TIMEOUT`
            on CPU.

    Yields:
        ``"cuda"`` (after ``torch.cuda.set_device(local_rank)``) or ``"cpu"``.
    """
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        device_type = "cuda"
        torch.cuda.set_device(env.local_rank)
        backend = "cuda:nccl,cpu:gloo"
        pg_timeout = timeout or GPU_COLLECTIVE_TIMEOUT
    else:
        device_type = "cpu"
        backend = "gloo"
        pg_timeout = timeout or PROCESS_GROUP_TIMEOUT
    if env.under_torchrun and env.agent_store and env.nodes == 1 and env.master_addr:
        # The agent's TCP store outlives a restart, so a restarted worker group
        # can read the previous attempt's gloo/NCCL addresses and fail to
        # connect (pytorch/pytorch#135712). With one agent the restart count is
        # the same on every worker, so it can isolate the attempts' keys.
        client = dist.TCPStore(
            env.master_addr,
            env.master_port or 0,
            env.world_size,
            is_master=False,
            timeout=PROCESS_GROUP_TIMEOUT,
        )
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"stormwatch/attempt-{env.attempt}", client),
            rank=env.rank,
            world_size=env.world_size,
            timeout=pg_timeout,
        )
    elif env.under_torchrun:
        if env.agent_store and env.max_restarts > 0:
            log.warning(
                "torchrun shares its TCP store with workers and may restart them: a restarted "
                "worker group can fail to connect (pytorch/pytorch#135712); start torchrun "
                "with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
            )
        dist.init_process_group(backend, timeout=pg_timeout)
    else:
        dist.init_process_group(
            backend,
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=pg_timeout,
        )
    log.info(
        "process group: rank %d/%d, backend %s, collective timeout %.0f s",
        env.rank,
        env.world_size,
        backend,
        pg_timeout.total_seconds(),
    )
    try:
        yield device_type
    finally:
        dist.destroy_process_group()


__all__ = ["GPU_COLLECTIVE_TIMEOUT", "PROCESS_GROUP_TIMEOUT", "RankEnv", "distributed"]
