"""Parallel dimensions: one validated object that owns the device mesh and hands it out by name.

Four dimensions, outermost first: ``pp`` (pipeline stages), ``dp_replicate``
(HSDP replicas: whole copies of the sharded model), ``dp_shard`` (FSDP2
shards; the CLI's ``--dp``) and ``tp`` (tensor parallel). The global rank is
``((pp_i * dp_replicate + r_i) * dp_shard + s_i) * tp + t_i``: ranks that
differ only in their ``tp`` coordinate are adjacent so that the chattiest
group (TP, collectives inside every layer) stays on one node, and pipeline
stages (point-to-point traffic once per micro-batch) are the farthest apart,
as in torchtitan's ``ParallelDims``.

The mesh holds ``dp_shard`` and ``tp`` always (every parameter is a DTensor
sharded over ``dp_shard``, whatever the degrees, so checkpoints have one
layout) and ``pp`` / ``dp_replicate`` only when their degree is > 1; the
metrics label every collective with the name of its mesh dimension
(``mesh_dim`` = ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``).

"Data parallel" as the data sees it is ``dp = dp_replicate x dp_shard``:
each of those ranks reads its own batch (:attr:`ParallelDims.dp`,
:meth:`ParallelDims.dp_rank`). This module does not import torch until a
mesh is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stormwatch.errors import ConfigError
from stormwatch.trainer.errors import TrainerError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: Dimensions that are always in the mesh, even at degree 1.
_ALWAYS = frozenset({"dp_shard", "tp"})


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degrees of each parallel dimension for a job of ``world_size`` ranks.

    Attributes:
        pp: pipeline-parallel degree (stages), outermost.
        dp_replicate: HSDP replica degree (gradients all-reduced across replicas).
        dp_shard: FSDP2 shard degree (parameters sharded, gradients reduce-scattered).
        tp: tensor-parallel degree, innermost.
        world_size: number of ranks in the job (``WORLD_SIZE``).

    Raises:
        ConfigError: a degree is not a positive integer, or the product of
            the degrees differs from ``world_size`` (the message names the
            degrees and the world size).
    """

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    world_size: int = 1
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, value in (*self.degrees, ("world_size", self.world_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}: must be an integer >= 1 (got {value!r})")
        product = 1
        for _, degree in self.degrees:
            product *= degree
        if product != self.world_size:
            shown = " x ".join(f"{name}={degree}" for name, degree in self.degrees)
            raise ConfigError(
                f"parallel degrees {shown} = {product} ranks, but the world size is "
                f"{self.world_size}; choose degrees whose product is {self.world_size}"
            )

    @property
    def degrees(self) -> tuple[tuple[str, int], ...]:
        """``(name, degree)`` of every dimension, outermost first."""
        return (
            ("pp", self.pp),
            ("dp_replicate", self.dp_replicate),
            ("dp_shard", self.dp_shard),
            ("tp", self.tp),
        )

    @property
    def mesh_degrees(self) -> tuple[tuple[str, int], ...]:
        """The dimensions the mesh holds (``dp_shard``, ``tp`` and any other of degree > 1)."""
        return tuple((n, d) for n, d in self.degrees if n in _ALWAYS or d > 1)

    @property
    def dp(self) -> int:
        """Data-parallel degree as the data sees it: ``dp_replicate x dp_shard`` batches per step."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_enabled(self) -> bool:
        """True when gradients are reduced across more than one data-parallel rank."""
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        """True when layers are sharded across more than one rank."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """True when the layers are split into more than one pipeline stage."""
        return self.pp > 1

    def coordinate(self, rank: int) -> dict[str, int]:
        """This rank's index along every dimension (degree-1 ones are 0).

        E.g. ``{"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 0}`` for rank 2 of
        ``dp_shard=2 x tp=2``.

        Raises:
            ConfigError: ``rank`` is outside ``[0, world_size)``.
        """
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank: must be in [0, {self.world_size}) (got {rank})")
        coords: dict[str, int] = {}
        stride = self.world_size
        for name, degree in self.degrees:
            stride //= degree
            coords[name] = (rank // stride) % degree
        return coords

    def dp_rank(self, rank: int) -> int:
        """Index of ``rank``'s batch among the ``dp`` data-parallel ones (``r_i * dp_shard + s_i``).

        Raises:
            ConfigError: ``rank`` is outside ``[0, world_size)``.
        """
        coords = self.coordinate(rank)
        return coords["dp_replicate"] * self.dp_shard + coords["dp_shard"]

    def build_mesh(
        self, device_type: str, *, group_options: Callable[[], Any] | None = None
    ) -> DeviceMesh:
        """Create (once) and return the N-D mesh named by :attr:`mesh_degrees`.

        The default process group must already be initialised with
        ``world_size`` ranks.

        Args:
            device_type: ``"cpu"`` or ``"cuda"``.
            group_options: makes the backend options of one new process group
                (:meth:`stormwatch.trainer.runtime.Distributed.group_options`, which carry
                the collective timeout). Every dimension that needs groups of its own
                gets them made with fresh options; without them torch gives the
                sub-groups its default timeout (30 minutes), not the default group's.
                A dimension over every rank reuses the default group (its timeout
                is set already). ``None``: torch's defaults.

        Raises:
            TrainerError: the mesh was already built for another device type.
        """
        from torch.distributed.device_mesh import init_device_mesh

        if self._mesh is not None:
            if self._mesh.device_type != device_type:
                raise TrainerError(
                    f"mesh already built for {self._mesh.device_type!r}, not {device_type!r}"
                )
            return self._mesh
        names = tuple(name for name, _ in self.mesh_degrees)
        shape = tuple(degree for _, degree in self.mesh_degrees)
        override: dict[int | str, Any] | None = (
            None
            if group_options is None
            else {
                name: group_options()
                for name, degree in self.mesh_degrees
                if degree != self.world_size
            }
        )
        mesh = init_device_mesh(
            device_type, shape, mesh_dim_names=names, backend_override=override or None
        )
        object.__setattr__(self, "_mesh", mesh)  # frozen: the mesh is set exactly once
        return mesh

    @property
    def mesh(self) -> DeviceMesh:
        """The whole mesh.

        Raises:
            TrainerError: :meth:`build_mesh` has not been called.
        """
        if self._mesh is None:
            raise TrainerError("ParallelDims.build_mesh(device_type) must be called first")
        return self._mesh

    def __getitem__(self, name: str) -> DeviceMesh:
        """The 1-D sub-mesh of one dimension, e.g. ``dims["dp_shard"]``.

        Raises:
            KeyError: the mesh has no dimension of that name (``pp`` and
                ``dp_replicate`` are absent at degree 1).
            TrainerError: the mesh has not been built.
        """
        names = [n for n, _ in self.mesh_degrees]
        if name not in names:
            raise KeyError(f"no parallel dimension {name!r} in the mesh; have {names}")
        return self.mesh[name]

    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh FSDP2 shards over: ``dp_shard`` (1-D), or ``(dp_replicate, dp_shard)`` for HSDP.

        Raises:
            TrainerError: the mesh has not been built.
        """
        if self.dp_replicate > 1:
            return self.mesh["dp_replicate", "dp_shard"]
        return self["dp_shard"]

    def group_names(self) -> dict[str, str]:
        """Process-group name -> dimension name, for labelling collectives by ``mesh_dim``.

        Raises:
            TrainerError: the mesh has not been built.
        """
        return {self[name].get_group().group_name: name for name, _ in self.mesh_degrees}


__all__ = ["ParallelDims"]
