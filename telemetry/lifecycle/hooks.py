"""Where the session meets ``torch.distributed``: waiting for the process group, and the
mesh labels of its groups. Imports torch (only :meth:`Session.instrument_collectives`
and :meth:`Session.label_mesh` import this module).

``torch.distributed.init_process_group`` is wrapped once per process so that whoever
waits (:func:`when_initialised`) is called as soon as it returns, on the thread that
created the group (the training thread, whose collectives are then counted), and so that
the call itself runs inside the contexts registered with :func:`around_init` (the
session's ``rendezvous`` phase). Code that created the group through a name imported
before the wrapping is caught by :func:`initialised` checks at the next step mark instead.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

_waiting: list[Callable[[], None]] = []
_around: list[Callable[[], contextlib.AbstractContextManager[Any]]] = []
_wrapped = False


def initialised() -> bool:
    """The default process group exists."""
    return dist.is_available() and dist.is_initialized()


def when_initialised(callback: Callable[[], None]) -> None:
    """Call ``callback`` now if the process group exists, else right after
    ``torch.distributed.init_process_group`` returns (once)."""
    if initialised():
        callback()
        return
    _waiting.append(callback)
    _wrap()


def around_init(context: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
    """Run the next ``torch.distributed.init_process_group`` call inside ``context()``
    (once; nothing when the process group exists already)."""
    if initialised():
        return
    _around.append(context)
    _wrap()


def _wrap() -> None:
    global _wrapped
    if _wrapped or not dist.is_available():
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            while _around:
                stack.enter_context(_around.pop(0)())
            out = original(*args, **kwargs)
        while _waiting:
            _waiting.pop(0)()
        return out

    dist.init_process_group = init_process_group
    _wrapped = True


def mesh_groups(mesh: Any) -> dict[str, str]:
    """Process-group name -> mesh dimension name of a ``DeviceMesh`` with named dimensions.

    Raises:
        ValueError: the mesh has no dimension names.
    """
    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise ValueError("the DeviceMesh has no mesh_dim_names (build it with mesh_dim_names=...)")
    return {mesh.get_group(name).group_name: name for name in names}


__all__ = ["around_init", "initialised", "mesh_groups", "when_initialised"]
