"""The telemetry API's promise to training: one clear warning per kind of misuse, never an
exception.

Every public entry point of :mod:`stormwatch.telemetry` runs its body through
:func:`never_raises`, and reports what is wrong with :func:`warn_once`: one WARNING on
the ``stormwatch.telemetry`` logger per kind (``step``, ``loss``, ``before_init``, ...)
per process, naming the argument and the fix; later occurrences are counted
(:data:`WARNINGS`), not logged again. No torch import here.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

#: The logger every warning of the API goes to.
LOGGER_NAME = "stormwatch.telemetry"
logger = logging.getLogger(LOGGER_NAME)

F = TypeVar("F", bound=Callable[..., Any])


class OnceWarnings:
    """Warns once per kind; counts every occurrence (:attr:`counts`)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def warn(self, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args`` at WARNING the first time ``kind`` occurs; True if logged."""
        with self._lock:
            self.counts[kind] += 1
            first = self.counts[kind] == 1
        if first:
            logger.warning("stormwatch.telemetry: " + message, *args)
        return first

    def reset(self) -> None:
        """Forget what was warned (tests)."""
        with self._lock:
            self.counts.clear()


#: The process's warnings (one per kind per process; calls before ``init`` have no
#: session to hold them).
WARNINGS = OnceWarnings()


def warn_once(kind: str, message: str, *args: object) -> bool:
    """:meth:`OnceWarnings.warn` on :data:`WARNINGS`."""
    return WARNINGS.warn(kind, message, *args)


def never_raises(default: Any = None) -> Callable[[F], F]:
    """Decorate a public function: an exception inside it is one warning (kind
    ``internal:<name>``, with the traceback) and the call returns ``default``.

    A call with arguments the function does not take (a missing, unknown or extra one) is
    the caller's mistake, not stormwatch's: one warning per different mistake (kind
    ``call:<name>:<what is wrong>``) naming it and the signature, and the call is ignored. (Told apart only once a ``TypeError`` is
    raised, by binding the arguments to the signature: nothing is added to a good call.)
    """

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TypeError as exc:
                try:
                    signature.bind(*args, **kwargs)
                except TypeError as wrong:
                    warn_once(
                        f"call:{fn.__qualname__}:{wrong}",
                        "%s%s called wrongly (%s); the call is ignored and training continues",
                        _public_name(fn),
                        _shown(signature),
                        wrong,
                    )
                    return default
                _internal(fn, exc)
                return default
            except Exception as exc:
                _internal(fn, exc)
                return default

        return guarded  # type: ignore[return-value]

    return decorate


def _public_name(fn: Callable[..., Any]) -> str:
    """``Session.step`` (a method) or ``stormwatch.telemetry.step``, as a user writes it."""
    return fn.__qualname__ if "." in fn.__qualname__ else f"stormwatch.telemetry.{fn.__name__}"


def _shown(signature: inspect.Signature) -> str:
    """The signature without ``self``, as the user calls it."""
    params = [p for name, p in signature.parameters.items() if name != "self"]
    shown = signature.replace(parameters=params, return_annotation=inspect.Signature.empty)
    return str(shown).replace("'", "")  # postponed annotations are strings: unquoted


def _internal(fn: Callable[..., Any], exc: Exception) -> None:
    """One warning for a failure inside stormwatch (its traceback at DEBUG)."""
    if warn_once(
        f"internal:{fn.__qualname__}",
        "%s failed inside stormwatch (training continues; please report it): %s: %s",
        fn.__qualname__,
        type(exc).__name__,
        exc,
    ):
        logger.debug("traceback of the failure above", exc_info=True)


__all__ = ["LOGGER_NAME", "WARNINGS", "OnceWarnings", "never_raises", "warn_once"]
