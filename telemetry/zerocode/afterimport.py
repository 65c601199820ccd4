"""Run a callback once a module has been imported, without importing it (a post-import hook).

The bootstrap must not import torch (a job may set variables torch reads at import, such as
``OMP_NUM_THREADS``, before its own ``import torch``), yet collective counting has to be
in place before the job calls ``init_process_group``. :func:`after_import` puts a finder
first on :data:`sys.meta_path` that, when the module is imported, hands its spec to the
other finders and wraps the loader so that the callback runs right after the module's
code, before the importer gets it back. The finder removes itself then: the hook fires
once, at the cost of one string comparison per import until it does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

log = logging.getLogger("stormwatch.telemetry")


class _Loader(importlib.abc.Loader):
    """Delegates to the module's own loader; calls the hook after ``exec_module``. The
    module sees its own loader (``__loader__``, ``__spec__.loader``) from before its code
    runs, so nothing of this wrapper stays behind."""

    def __init__(self, loader: importlib.abc.Loader, done: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._done = done

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._done(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._callback = callback
        self._looking = False

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name or self._looking:
            return None
        self._looking = True
        try:
            spec = next(
                (
                    found
                    for finder in sys.meta_path
                    if finder is not self
                    and (found := finder.find_spec(fullname, path, target)) is not None
                ),
                None,
            )
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            self._callback(module)
        except Exception:  # the import itself must succeed whatever the hook does
            log.warning("hook after importing %s failed", self._name, exc_info=True)


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once the top-level module ``name`` has been imported: now
    if it is already, else right after its code has run (on the importing thread). A
    failing callback is one warning; the import goes on."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


__all__ = ["after_import"]
