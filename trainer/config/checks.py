"""The two checks every trainer config uses; each failure names the field (or the flag's name).

Messages read ``<name>: <problem> (got <value>)``, ``<name>`` being the name the
user typed where it differs from the field (``checkpoint_every`` for
``CheckpointConfig.every``), so that a mistake on the command line is found at once.
"""

from __future__ import annotations

from pathlib import Path

from stormwatch.errors import ConfigError


def check(ok: bool, name: str, message: str) -> None:
    """Raise ``ConfigError("<name>: <message>")`` unless ``ok``.

    Raises:
        ConfigError: ``ok`` is false.
    """
    if not ok:
        raise ConfigError(f"{name}: {message}")


def check_positive_int(value: int, name: str) -> None:
    """``value`` is an integer >= 1 (a bool is not an integer here).

    Raises:
        ConfigError: it is not.
    """
    check(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        name,
        f"must be an integer >= 1 (got {value!r})",
    )


def check_folder(path: Path | None, name: str) -> None:
    """``path``, when given and present, is a folder (a missing one is created at start-up).

    Raises:
        ConfigError: it exists and is not a folder.
    """
    if path is not None and path.exists():
        check(path.is_dir(), name, f"{path} exists and is not a directory")


__all__ = ["check", "check_folder", "check_positive_int"]
