"""Parallel dimensions: one validated object that owns the device mesh and hands it out by name.

Today there are two dimensions, outermost first: ``dp`` (data parallel,
FSDP2-sharded) and ``tp`` (tensor parallel). Ranks that differ only in their
``tp`` coordinate are adjacent (``rank = dp_rank * tp + tp_rank``) so that the
chattiest group (TP, collectives inside every layer) stays on one node.

To add a dimension (``pp``, ``dp_replicate`` for HSDP, ...): add a field,
validate it in ``__post_init__`` like the others and insert it into
:meth:`ParallelDims.degrees` at its place in the outer-to-inner order; the
mesh, the product check and :meth:`ParallelDims.coordinate` follow from that
list. This module does not import torch until a mesh is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stormwatch.errors import ConfigError
from stormwatch.trainer.errors import TrainerError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Degrees of each parallel dimension for a job of ``world_size`` ranks.

    Attributes:
        dp: data-parallel degree (FSDP2 shards parameters over it).
        tp: tensor-parallel degree.
        world_size: number of ranks in the job (``WORLD_SIZE``).

    Raises:
        ConfigError: a degree is not a positive integer, or the product of
            the degrees differs from ``world_size`` (the message names the
            degrees and the world size).
    """

    dp: int = 1
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
        """``(name, degree)`` of every dimension, outermost first (the mesh's order)."""
        return (("dp", self.dp), ("tp", self.tp))

    @property
    def dp_enabled(self) -> bool:
        """True when gradients are reduced across more than one data-parallel rank."""
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        """True when layers are sharded across more than one rank."""
        return self.tp > 1

    def coordinate(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension, e.g. ``{"dp": 1, "tp": 0}`` for rank 2 of 2x2.

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

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create (once) and return the N-D mesh named by :meth:`degrees`.

        The default process group must already be initialised with
        ``world_size`` ranks.

        Args:
            device_type: ``"cpu"`` or ``"cuda"``.

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
        names = tuple(name for name, _ in self.degrees)
        shape = tuple(degree for _, degree in self.degrees)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
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
        """The 1-D sub-mesh of one dimension, e.g. ``dims["dp"]``.

        Raises:
            KeyError: no dimension has that name.
            TrainerError: the mesh has not been built.
        """
        names = [n for n, _ in self.degrees]
        if name not in names:
            raise KeyError(f"no parallel dimension {name!r}; have {names}")
        return self.mesh[name]

    def group_names(self) -> dict[str, str]:
        """Process-group name -> dimension name, for labelling collectives by ``mesh_dim``.

        Raises:
            TrainerError: the mesh has not been built.
        """
        return {self[name].get_group().group_name: name for name, _ in self.degrees}


__all__ = ["ParallelDims"]
