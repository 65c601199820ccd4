"""A session's collective counting: one :class:`~stormwatch.telemetry.comms.CollectiveCounter`,
made on first use, either entered for good once the process group exists
(:meth:`Collectives.always`, what ``init(collectives=True)`` asks for) or entered by the
job around the blocks it chooses (:meth:`Collectives.counter`). Its labels (process
group -> mesh dimension) can be given before or after it is made. No torch import here:
the counter's module is imported on first use.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any


class Collectives:
    """The session's counter (see the module docstring).

    Args:
        sink: receives counts and times (the rank's telemetry; also the observer).
        on_made: called with the counter once it is made (the dumper reads its recent ops).
        on_counting: called once counting for good has started (the heartbeat).
    """

    def __init__(
        self, sink: Any, *, on_made: Callable[[Any], None], on_counting: Callable[[], None]
    ) -> None:
        self._sink = sink
        self._on_made = on_made
        self._on_counting = on_counting
        self._lock = threading.RLock()
        self._counter: Any = None  # stormwatch.telemetry.comms.CollectiveCounter
        self._groups: dict[str, str] = {}
        self.counting_always = False  # entered until stop()

    def counter(self) -> Any:
        """The counter, made on first use (not entered)."""
        with self._lock:
            if self._counter is None:
                from stormwatch.telemetry.comms import CollectiveCounter

                self._counter = CollectiveCounter(
                    self._sink, groups=self._groups, observer=self._sink
                )
                self._on_made(self._counter)
            return self._counter

    def made(self) -> Any:
        """The counter if it was made, else None (nothing is made)."""
        return self._counter

    def always(self) -> None:
        """Enter the counter for good on this thread (once; not while the job has it entered)."""
        with self._lock:
            if self.counting_always:
                return
            counter = self.counter()
            if counter.observing:  # the job counts a block itself right now
                return
            counter.__enter__()
            self.counting_always = True
        self._on_counting()

    def instrument(
        self,
        around_init: Callable[[], Any],
        when_initialised: Callable[[], None],
    ) -> None:
        """Count every collective once the process group exists: ``around_init`` (a context
        manager factory: the ``rendezvous`` phase) wraps ``init_process_group`` and
        ``when_initialised`` runs after it (:mod:`.hooks`). Nothing when counting already;
        one warning when ``torch.distributed`` is not available."""
        if self.counting_always:
            return
        try:
            from stormwatch.telemetry.lifecycle import hooks
        except ImportError as exc:
            from stormwatch.telemetry.lifecycle.guard import warn_once

            warn_once(
                "collectives:torch",
                "instrument_collectives(): torch.distributed is not available (%s); "
                "collectives are not counted",
                exc,
            )
            return
        hooks.around_init(around_init)  # a heartbeat, and a stage, before the group
        hooks.when_initialised(when_initialised)

    def always_if_initialised(self) -> None:
        """:meth:`always` if the process group exists (it may have been made without the
        wrapped ``init_process_group``: through a name imported before ``init()``)."""
        if self.counting_always or "torch.distributed" not in sys.modules:
            return  # counting already, or no process group can exist
        from stormwatch.telemetry.lifecycle import hooks

        if hooks.initialised():
            self.always()

    def step_wait(self, seconds: float) -> float | None:
        """The collective wait of the step that just ended (at most ``seconds``); ``None``
        when not counting for good (the job measures its own)."""
        if not self.counting_always:
            return None
        counter = self._counter
        counter.poll(final=True)
        return float(min(counter.take_wait_seconds(), seconds))

    def label(self, groups: Mapping[str, str]) -> None:
        """Add process-group name -> mesh dimension labels."""
        with self._lock:
            self._groups.update(groups)
            if self._counter is not None:
                self._counter.label_groups(groups)

    def label_mesh(self, mesh: Any) -> None:
        """Label by the dimension names of ``mesh`` (a ``DeviceMesh``); one warning, and
        the labels kept, when it is not one."""
        from stormwatch.telemetry.lifecycle import hooks
        from stormwatch.telemetry.lifecycle.guard import warn_once

        try:
            groups = hooks.mesh_groups(mesh)
        except (ValueError, AttributeError) as exc:
            warn_once(
                "label_mesh:mesh", "label_mesh(%r): %s; collectives keep their labels", mesh, exc
            )
            return
        self.label(groups)

    def stop(self) -> None:
        """Leave the counter entered for good (a final poll first)."""
        with self._lock:
            always, self.counting_always = self.counting_always, False
        if always:
            self._counter.__exit__(None, None, None)


__all__ = ["Collectives"]
