"""Process-level setup: where this rank is (from torchrun's environment) and the process groups.

:class:`RankEnv` is parsed from the environment once, at the CLI edge
(``torch`` is not imported for that). :func:`distributed` initialises and
tears down the default process group: NCCL (plus gloo for CPU tensors) when
CUDA is available, gloo otherwise. Outside torchrun (no ``WORLD_SIZE``) it
builds a one-rank group over an in-memory store, so ``stormwatch train``
runs as world size 1 without any network setup.

Every process group has the collective timeout (:class:`Distributed`):
torch gives it to the default group only; a group made later without one
(``new_group``, or a DeviceMesh's sub-groups from ``init_device_mesh``)
falls back to torch's default of 30 minutes (10 on NCCL), so a collective on
a sub-group with a frozen peer would block that long. Every group the
trainer makes passes :meth:`Distributed.group_options` (the mesh) or
:attr:`Distributed.timeout` (``new_group``), and :func:`check_group_timeouts`
verifies, once the set-up is done, that no group of the rank has another.

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
from typing import Any

from stormwatch.errors import ConfigError
from stormwatch.trainer.errors import TrainerError

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
        attempt: restarts so far: of this node's worker group
            (``TORCHELASTIC_RESTART_COUNT``; node-local, see :func:`distributed`) as
            parsed, of the whole job once the ranks agreed it (the loop replaces it:
            :mod:`stormwatch.telemetry.restarts`).
        node_restarts: ``TORCHELASTIC_RESTART_COUNT`` (node-local), kept when
            ``attempt`` becomes the job's.
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
    node_restarts: int = 0
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
            node_restarts=number("TORCHELASTIC_RESTART_COUNT", 0),
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


@dataclass(frozen=True)
class Distributed:
    """The default process group as :func:`distributed` made it.

    Attributes:
        device_type: ``"cuda"`` or ``"cpu"``.
        timeout: the collective timeout every process group of the job must have.
    """

    device_type: str
    timeout: timedelta

    def group_options(self) -> Any:
        """Fresh backend options carrying :attr:`timeout`, for one new group (e.g. one
        DeviceMesh dimension: ``init_device_mesh(..., backend_override={dim: options})``,
        whose sub-groups otherwise get torch's default timeout).

        ``ProcessGroupNCCL.Options`` on GPU (the CPU side of ``cuda:nccl,cpu:gloo`` takes
        the timeout from the same options), ``ProcessGroupGloo._Options`` on CPU. A fresh
        object per group: torch writes the group's name and ranks into it.
        """
        import torch.distributed as dist

        if self.device_type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
        else:
            # the class gloo groups carry; the stub calls it Options (a different class here)
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = self.timeout
        return options


def group_timeouts() -> dict[str, timedelta]:
    """The collective timeout of every process group this rank is in, by
    ``"<description> (<name>)"`` (e.g. ``"mesh_tp (3)"``), per backend device when the
    group has several (``"default_pg (0) cuda"``).

    Reads torch's group registry (``distributed_c10d._world.pg_map``) and each backend's
    options: torch has no public API for either.
    """
    import torch
    from torch.distributed import distributed_c10d as c10d

    found: dict[str, timedelta] = {}
    for group in list(c10d._world.pg_map):
        devices = list(group._device_types)
        for device in devices:
            backend = group._get_backend(device)
            key = f"{group.group_desc} ({group.group_name})"
            if len(devices) > 1:
                key += f" {torch.device(device).type}"
            found[key] = backend.options._timeout
    return found


def check_group_timeouts(expected: timedelta) -> dict[str, timedelta]:
    """Verify that every process group of this rank has the collective timeout ``expected``.

    Returns:
        :func:`group_timeouts` (all equal to ``expected``).

    Raises:
        TrainerError: a group has another timeout (names each group and its timeout):
            a group was made without the trainer's options, and a collective on it
            with a lost peer would block for that long.
    """
    found = group_timeouts()
    wrong = {name: t for name, t in found.items() if t != expected}
    if wrong:
        shown = ", ".join(f"{name}: {t.total_seconds():g} s" for name, t in sorted(wrong.items()))
        raise TrainerError(
            f"process groups without the collective timeout of "
            f"{expected.total_seconds():g} s: {shown}; make every group with "
            "Distributed.group_options() or timeout=Distributed.timeout"
        )
    return found


@contextlib.contextmanager
def distributed(env: RankEnv, *, timeout: timedelta | None = None) -> Iterator[Distributed]:
    """Initialise the default process group for ``env``; yields it as :class:`Distributed`.

    Args:
        timeout: collective timeout of every process group; a collective that
            does not complete within it raises (gloo) or aborts the
            communicator (NCCL). Default :data:`GPU_COLLECTIVE_TIMEOUT` on GPU,
            :data:`PROCESS_GROUP_TIMEOUT` on CPU. The default group gets it
            here; groups made later get it from :class:`Distributed` (torch
            does not pass it on).

    Yields:
        The device type (``"cuda"`` after ``torch.cuda.set_device(local_rank)``,
        or ``"cpu"``) and the resolved timeout.
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
        yield Distributed(device_type, pg_timeout)
    finally:
        dist.destroy_process_group()


__all__ = [
    "GPU_COLLECTIVE_TIMEOUT",
    "PROCESS_GROUP_TIMEOUT",
    "Distributed",
    "RankEnv",
    "check_group_timeouts",
    "distributed",
    "group_timeouts",
]
