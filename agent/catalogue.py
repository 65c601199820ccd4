"""The metric catalogue: every metric the agent exports, as data.

The single source is ``catalogue.csv`` next to this module (columns ``name,
type, unit, labels, source, help``; ``labels`` space-separated). Collectors
take their help text from here, ``stormwatch agent metrics`` prints it, and a
test fails when ``/metrics`` exports a family that is missing here or has
another type. Names are the names as exposed in the Prometheus text format
(counters with their ``_total`` suffix). ``source`` says which collector (or
the trainer, through its multiprocess files) produces the metric.
"""

from __future__ import annotations

import collections
import csv
import functools
import io
from collections.abc import Iterator
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stormwatch.agent.errors import AgentError

MetricType = Literal["gauge", "counter", "histogram", "untyped"]

_NAME_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"


class MetricSpec(BaseModel):
    """One catalogue row.

    Attributes:
        name: exposed family name (``# TYPE`` line of the text format).
        type: exposition type.
        unit: ``seconds``, ``bytes``, ``ratio``, ``1`` (dimensionless), or the
            dcgm-exporter unit (``MiB``, ``MHz``, ``W``, ``mJ``...) for DCGM names.
        labels: label names (histograms also carry ``le``).
        source: the producing collector (``gpu``, ``nvlink``, ``ranks``...; DCGM
            names are recognisable by their ``DCGM_`` prefix), ``agent`` for the
            agent's own health metrics, ``trainer`` for the ranks' multiprocess files.
        help: HELP text.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME_PATTERN)
    type: MetricType
    unit: str = Field(min_length=1)
    labels: tuple[str, ...]
    source: str = Field(min_length=1)
    help: str = Field(min_length=1)

    @field_validator("labels", mode="before")
    @classmethod
    def _split_labels(cls, value: object) -> object:
        return tuple(value.split()) if isinstance(value, str) else value


class Catalogue:
    """Immutable lookup over the catalogue rows, in file order."""

    def __init__(self, specs: tuple[MetricSpec, ...]) -> None:
        self._specs = specs
        self._by_name = {spec.name: spec for spec in specs}
        if len(self._by_name) != len(specs):
            counts = collections.Counter(spec.name for spec in specs)
            dupes = sorted(name for name, n in counts.items() if n > 1)
            raise AgentError(f"metric catalogue: duplicate names {dupes}")

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> MetricSpec:
        """The spec of ``name``; raises ``KeyError`` for a name not in the catalogue."""
        return self._by_name[name]

    def help(self, name: str) -> str:
        """HELP text of ``name`` (``KeyError`` when it is not catalogued)."""
        return self._by_name[name].help

    def by_source(self, source: str) -> tuple[MetricSpec, ...]:
        """Rows produced by ``source`` (e.g. ``"gpu"``), in file order."""
        return tuple(spec for spec in self._specs if spec.source == source)


def parse_catalogue(text: str, *, origin: str = "catalogue.csv") -> Catalogue:
    """Parse catalogue CSV text.

    Raises:
        AgentError: a row is invalid (message names the line and field) or a name repeats.
    """
    specs: list[MetricSpec] = []
    reader = csv.DictReader(io.StringIO(text))
    for row in reader:
        try:
            specs.append(MetricSpec.model_validate(row))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise AgentError(f"{origin}:{reader.line_num}: {field}: {err['msg']}") from exc
    return Catalogue(tuple(specs))


@functools.cache
def load_catalogue() -> Catalogue:
    """The packaged catalogue (read once per process)."""
    text = resources.files("stormwatch.agent").joinpath("catalogue.csv").read_text("utf-8")
    return parse_catalogue(text)


__all__ = ["Catalogue", "MetricSpec", "MetricType", "load_catalogue", "parse_catalogue"]
