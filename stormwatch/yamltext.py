"""Reading a settings file's YAML text into a mapping, once for every component.

The components' settings files (the agent's web config, the responder's runbook policy)
are YAML mappings validated by a pydantic model; this is the step before the model:
YAML syntax, an empty file, a top level that is not a mapping. Each caller names its
file and words the two problems as its users know them.
"""

from __future__ import annotations

from typing import Any

import yaml

from stormwatch.errors import ConfigError


def yaml_mapping(
    text: str,
    where: str,
    *,
    error: type[ConfigError] = ConfigError,
    invalid: str = "not valid YAML",
    not_mapping: str = "must be a mapping",
) -> dict[str, Any]:
    """``text`` read as a YAML mapping; an empty document is ``{}``.

    Args:
        where: the file, as messages name it (``web config /etc/x.yml``, ``policy.yml``).
        error: the :class:`ConfigError` subclass raised.
        invalid: what a YAML syntax error is called (``invalid YAML``).
        not_mapping: what a top level that is not a mapping is told, with the valid keys.

    Raises:
        error: ``"<where>: <invalid>: <parser message>"`` or ``"<where>: <not_mapping>"``.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{where}: {invalid}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{where}: {not_mapping}")
    return data


__all__ = ["yaml_mapping"]
