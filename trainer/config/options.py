"""Command-line options declared once, on the config fields they set, and the click options derived.

A config field that ``stormwatch train`` sets is declared with :func:`option`:
its default, plus an :class:`Option` in the field's metadata (flag names, help,
environment variable, choices, a range the parser checks, a default decided at
run time). From these declarations :func:`click_options` derives the ``click``
options and :func:`option_values` maps the parsed values back to a config's
keyword arguments. Validation stays in each config's ``__post_init__``: the
command line only parses, so a bad value gets the same message from the CLI
and from Python (e.g. ``steps: must be an integer >= 1 (got 0)``).

How a declaration becomes a click option:

* type, from the field's annotation (``X | None`` counts as ``X``): ``int``,
  ``float``, ``str`` -> ``click.INT``/``FLOAT``/``STRING``; ``bool`` -> a flag;
  ``Path`` -> a folder (every path the trainer takes is a folder); overridden by
  ``choices`` (``click.Choice``), ``bounds`` (``click.IntRange``/``FloatRange``)
  and ``auto`` (an integer >= 1 or ``auto``, which parses to ``None``);
* default: the field's, unless ``cli_default`` is given (a field without a
  default, like ``TrainConfig.steps``, or one the CLI derives at run time, like ``--dp auto``);
* help: ``help``, then ``[default: <default_text>; env: <envvar>]`` for what
  click cannot show itself (a default decided at run time, the variable);
* the parameter's name: the first long flag without dashes (``--checkpoint-dir``
  -> ``checkpoint_dir``), unique over everything one command derives.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

#: Key of the :class:`Option` in a dataclass field's metadata.
OPTION_KEY = "stormwatch.option"


class _FieldDefault:
    """Marker: the command line's default is the field's own."""

    def __repr__(self) -> str:
        return "<field default>"


FIELD_DEFAULT: Any = _FieldDefault()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Option:
    """How one config field is set from the command line.

    Attributes:
        flags: the flag names, long first (``("--quiet", "-q")``).
        help: what the option does (one or two sentences).
        envvar: environment variable read when the flag is not given.
        default_text: what ``[default: ...]`` says where the default is decided
            at run time (e.g. ``<log-dir>/dumps``); ``None``: click shows the value.
        metavar: the value's name in ``--help`` (``SECONDS``); ``None``: the type's.
        choices: the only values accepted (checked by the parser).
        bounds: ``(min, max)`` checked by the parser, inclusive (``None``: the
            config's own check is the only one).
        cli_default: the command line's default where it is not the field's.
        auto: the option also takes ``auto`` (``None``: a parallel degree
            derived from the world size at start).
        default_under: ``(option, name)``: when not given, the folder is
            ``<that option's folder>/<name>`` (applied by :func:`folder_defaults`;
            ``default_text`` then defaults to ``<option>/<name>``).
    """

    flags: tuple[str, ...]
    help: str
    envvar: str | None = None
    default_text: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    bounds: tuple[float, float] | None = None
    cli_default: Any = FIELD_DEFAULT
    auto: bool = False
    default_under: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        """The click parameter's name: the first long flag, ``-`` as ``_``."""
        flag = next(f for f in self.flags if f.startswith("--"))
        return flag.removeprefix("--").replace("-", "_")

    @property
    def default_note(self) -> str | None:
        """What ``[default: ...]`` says for a default decided at run time (``None``: click's own)."""
        if self.default_text is None and self.default_under is not None:
            other, name = self.default_under
            return f"<{other.replace('_', '-')}>/{name}"
        return self.default_text

    @property
    def help_text(self) -> str:
        """``help`` with the notes click cannot write itself (run-time default, variable)."""
        default = self.default_note
        notes = [] if default is None else [f"default: {default}"]
        if self.envvar is not None:
            notes.append(f"env: {self.envvar}")
        return f"{self.help} [{'; '.join(notes)}]" if notes else self.help


def option(*flags: str, default: Any = dataclasses.MISSING, **declaration: Any) -> Any:
    """A dataclass field set by the flags ``flags``; ``declaration``: the rest of its :class:`Option`.

    Use as ``lr: float = option("--lr", default=3e-3, help="AdamW learning rate.")``.

    Raises:
        TypeError: a keyword that :class:`Option` does not have (a declaration mistake).
    """
    declared = Option(flags=flags, **declaration)
    return dataclasses.field(default=default, metadata={OPTION_KEY: declared})


@dataclasses.dataclass(frozen=True)
class Declared:
    """One config field with the option that sets it.

    Attributes:
        config: the config class.
        field: the dataclass field.
        option: its declaration.
        kind: the field's type without ``None`` (``int`` for ``int | None``).
    """

    config: type
    field: dataclasses.Field[Any]
    option: Option
    kind: type

    @property
    def default(self) -> Any:
        """The command line's default: ``cli_default``, else the field's.

        Raises:
            TypeError: neither exists (a declaration mistake, not a user's).
        """
        if self.option.cli_default is not FIELD_DEFAULT:
            return self.option.cli_default
        if self.field.default is dataclasses.MISSING:
            raise TypeError(
                f"{self.config.__name__}.{self.field.name}: an option needs a default "
                "(the field's, or cli_default)"
            )
        return self.field.default


def declared(config: type, *, nested: bool = False) -> list[Declared]:
    """The fields of ``config`` that declare an option, in field order.

    Args:
        config: a dataclass.
        nested: also those of its dataclass-typed fields (recursively, each
            where its field stands), e.g. ``TrainConfig``'s ``model``, ``data``...
    """
    hints = typing.get_type_hints(config)
    found: list[Declared] = []
    for item in dataclasses.fields(config):
        kind = _without_none(hints[item.name])
        declaration = item.metadata.get(OPTION_KEY)
        if declaration is not None:
            found.append(Declared(config, item, declaration, kind))
        elif nested and isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found.extend(declared(kind, nested=True))
    return found


def click_options(*configs: type) -> list[click.Option]:
    """The click options of every declared field of ``configs`` (nested ones included), in order.

    Raises:
        TypeError: two declarations derive the same parameter name, or a field's
            type has no click counterpart (declaration mistakes).
    """
    options: list[click.Option] = []
    seen: dict[str, str] = {}
    for config in configs:
        for item in declared(config, nested=True):
            where = f"{item.config.__name__}.{item.field.name}"
            name = item.option.name
            if name in seen:
                raise TypeError(f"{where} and {seen[name]} both declare the option {name!r}")
            seen[name] = where
            options.append(_click_option(item))
    return options


def option_values(config: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``config``'s own declared fields (not nested ones) -> their parsed values in ``values``.

    Args:
        config: a dataclass with declared options.
        values: parsed command-line values by parameter name (click's ``**kwargs``).
    """
    return {item.field.name: values[item.option.name] for item in declared(config)}


def folder_defaults(config: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each folder left unset that has a ``default_under`` filled in.

    ``--dump-dir`` unset and ``--log-dir logs`` give ``dump_dir = logs/dumps``; with
    ``--log-dir`` unset too it stays ``None`` (off).

    Args:
        config: the dataclass whose declarations (nested ones included) apply.
        values: parsed command-line values by parameter name.
    """
    out = dict(values)
    for item in declared(config, nested=True):
        under = item.option.default_under
        if under is None or out[item.option.name] is not None:
            continue
        base = out[under[0]]
        out[item.option.name] = None if base is None else Path(base) / under[1]
    return out


def _without_none(hint: Any) -> Any:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return hint


def _click_option(item: Declared) -> click.Option:
    option = item.option
    decls = [option.name, *option.flags]
    common: dict[str, Any] = {
        "default": item.default,
        "help": option.help_text,
        "envvar": option.envvar,
        "metavar": option.metavar,
    }
    if item.kind is bool:
        return click.Option(decls, is_flag=True, **common)
    return click.Option(decls, type=_click_type(item), **common)


def _click_type(item: Declared) -> click.ParamType:
    option, kind = item.option, item.kind
    if option.auto:
        return DEGREE_OR_AUTO
    if option.choices is not None:
        return click.Choice(option.choices)
    if option.bounds is not None:
        low, high = option.bounds
        return click.IntRange(int(low), int(high)) if kind is int else click.FloatRange(low, high)
    if kind is Path:
        return click.Path(path_type=Path, file_okay=False, dir_okay=True)
    simple: dict[type, click.ParamType] = {int: click.INT, float: click.FLOAT, str: click.STRING}
    if kind not in simple:
        raise TypeError(f"{item.config.__name__}.{item.field.name}: no click type for {kind!r}")
    return simple[kind]


class _DegreeOrAuto(click.ParamType):
    """A parallel degree (integer >= 1) or ``auto`` (``None``: derived from the world size)."""

    name = "INTEGER|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            degree = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor 'auto'", param, ctx)
        if degree < 1:
            self.fail(f"{degree} is not a degree: give an integer >= 1, or 'auto'", param, ctx)
        return degree


#: The click type of an option declared with ``auto=True``.
DEGREE_OR_AUTO = _DegreeOrAuto()


__all__ = [
    "DEGREE_OR_AUTO",
    "FIELD_DEFAULT",
    "OPTION_KEY",
    "Declared",
    "Option",
    "click_options",
    "declared",
    "folder_defaults",
    "option",
    "option_values",
]
