"""How a run survives and reports failures: checkpoints (:class:`CheckpointConfig`), the
chaos control channel that provokes them (:class:`ControlConfig`), and bounded
hangs with post-mortem dumps (:class:`DebugConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stormwatch.telemetry import DEFAULT_FLIGHT_RECORDER_ENTRIES
from stormwatch.trainer.config.checks import check, check_folder, check_positive_int
from stormwatch.trainer.config.options import option

#: ``--checkpoint-mode`` values (see :class:`CheckpointConfig`).
CHECKPOINT_MODES = ("sync", "async")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to write DCP checkpoints.

    Attributes:
        directory: checkpoint root; ``None`` disables saving and resuming.
        every: save after every ``every``-th step (and never at step 0).
        keep: number of complete checkpoints to keep (default 3); older ones
            are deleted only after a newer one is complete (FC-11).
        mode: ``"sync"`` (default: training waits for the save) or
            ``"async"`` (training goes on while a background thread copies,
            writes and commits; the loop blocks for the state-dict capture, and
            for the copy only if it has not ended by the next optimizer step, see :mod:`stormwatch.trainer.checkpoint.background`).
        failures_allowed: failed saves in a row the job trains through (each is
            counted and logged, the partial folder is left for the next resume's
            clean-up); one more stops the job with the last error. 0: the first
            failed save stops it. The CLI takes 0..1000.
    """

    directory: Path | None = option(
        "--checkpoint-dir",
        default=None,
        help="Save/resume DCP checkpoints here (shared by all ranks). Off when unset.",
    )
    every: int = option(
        "--checkpoint-every", default=10, help="Save after every N-th step (and after the last)."
    )
    keep: int = option("--keep", default=3, help="Complete checkpoints to keep.")
    mode: str = option(
        "--checkpoint-mode",
        default="sync",
        choices=CHECKPOINT_MODES,
        help="sync: training waits for each save; async: copied, written and committed in "
        "the background (DCP) while training goes on.",
    )
    failures_allowed: int = option(
        "--checkpoint-failures-allowed",
        default=3,
        bounds=(0, 1000),
        help="Failed saves in a row (disk full, read-only, I/O error) the job trains through; "
        "one more stops it. 0: stop at the first failed save.",
    )

    def __post_init__(self) -> None:
        check(
            self.mode in CHECKPOINT_MODES,
            "checkpoint_mode",
            f"must be 'sync' or 'async' (got {self.mode!r})",
        )
        check_positive_int(self.every, "checkpoint_every")
        check_positive_int(self.keep, "keep")
        check(
            isinstance(self.failures_allowed, int) and self.failures_allowed >= 0,
            "checkpoint_failures_allowed",
            f"must be an integer >= 0 (got {self.failures_allowed!r})",
        )
        check_folder(self.directory, "checkpoint_dir")


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """Where the chaos control channel reads fault points (:mod:`stormwatch.trainer.control`).

    Attributes:
        directory: folder of the per-rank ``rank<R>.json`` files; ``None``
            disables the channel (the CLI defaults it to ``<metrics-dir>/control``).
    """

    directory: Path | None = option(
        "--control-dir",
        default=None,
        envvar="STORMWATCH_CONTROL_DIR",
        default_under=("metrics_dir", "control"),
        help="Chaos control files <dir>/rank<R>.json, polled once per step.",
    )

    def __post_init__(self) -> None:
        check_folder(self.directory, "control_dir")


@dataclass(frozen=True, kw_only=True)
class DebugConfig:
    """Bounded failure on hangs and post-mortem dumps (FC-10, :meth:`stormwatch.telemetry.Session.dump`).

    Attributes:
        dump_dir: where each rank writes ``rank<R>.json`` when training ends
            abnormally; ``None`` disables dumps (the CLI defaults it to
            ``<log-dir>/dumps``).
        collective_timeout: seconds after which a collective that has not
            completed fails the rank, in every process group (the default group, the
            mesh's sub-groups, the async checkpoint's group; gloo also bounds
            connecting a new group by it); ``None``: 120 s on GPU, 300 s on CPU
            (:mod:`stormwatch.trainer.runtime`). The start-up stages have bounds of
            their own (``STORMWATCH_PHASE_BOUNDS``, :mod:`stormwatch.telemetry.phases`).
        flight_recorder_entries: PyTorch flight-recorder ring size (0: leave
            the recorder off unless the environment enables it; default
            :data:`~stormwatch.telemetry.DEFAULT_FLIGHT_RECORDER_ENTRIES`).
    """

    dump_dir: Path | None = option(
        "--dump-dir",
        default=None,
        default_under=("log_dir", "dumps"),
        help="Per-rank post-mortem dumps on hang, timeout or fatal error.",
    )
    collective_timeout: float | None = option(
        "--collective-timeout",
        default=None,
        metavar="SECONDS",
        default_text="120 on GPU, 300 on CPU",
        help="A collective of any process group not complete after this fails the rank.",
    )
    flight_recorder_entries: int = option(
        "--flight-recorder-entries",
        default=DEFAULT_FLIGHT_RECORDER_ENTRIES,
        help="PyTorch flight-recorder ring size (TORCH_FR_BUFFER_SIZE unless set); 0: off.",
    )

    def __post_init__(self) -> None:
        if self.collective_timeout is not None:
            check(
                isinstance(self.collective_timeout, (int, float))
                and math.isfinite(self.collective_timeout)
                and self.collective_timeout >= 1,
                "collective_timeout",
                f"must be a number of seconds >= 1 (got {self.collective_timeout!r})",
            )
        check(
            isinstance(self.flight_recorder_entries, int) and self.flight_recorder_entries >= 0,
            "flight_recorder_entries",
            f"must be an integer >= 0 (got {self.flight_recorder_entries!r})",
        )
        if self.dump_dir is not None and self.dump_dir.exists():
            check(self.dump_dir.is_dir(), "dump_dir", f"{self.dump_dir} is not a directory")


__all__ = ["CHECKPOINT_MODES", "CheckpointConfig", "ControlConfig", "DebugConfig"]
