"""Reading a settings file's YAML text into a mapping, once for every component.

The components' settings files (the agent's web config, the responder's runbook policy)
are YAML mappings validated by a pydantic model; this is the step before the model:
YAML syntax, a duplicate key (refused: YAML keeps the last one silently), an empty file, a
top level that is not a mapping. Each caller names its file and words the problems as its
users know them.

Files a user writes by hand and whose problems are reported with their line (experiment
files, target files) are read with :class:`StrictLoader` (duplicate keys and anchors
refused) and located with :func:`key_lines` / :func:`line_of`.
"""

from __future__ import annotations

import re
import unicodedata
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
        error: ``"<where>: <invalid>: <problem> at line L, column C"`` (one line) or
            ``"<where>: <not_mapping>"``.
    """
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise error(f"{where}: {invalid}: {yaml_problem(exc, text)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{where}: {not_mapping}")
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys: PyYAML keeps the last one silently, so
    a web config listing one user twice let the second password win unseen."""


class StrictLoader(UniqueKeyLoader):
    """:class:`UniqueKeyLoader` that also rejects anchors/aliases (a "billion laughs" file
    would expand to gigabytes).

    :attr:`kind` names the files in the anchor message (``experiment files``); a subclass
    sets its own.
    """

    kind = "these files"

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"YAML anchors and aliases (&name, *name) are not allowed in {self.kind}; "
                "write each value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


#: The tag of a merge key (``<<: *defaults``): merged keys may be overridden by explicit ones.
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """The mapping, refusing a key written twice. A merge key's keys are not checked: an
    explicit key overrides a merged one, as YAML's merge type says; ``construct_mapping``
    merges them after."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError as exc:  # a list or mapping as a key: PyYAML's own words, one line
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                "found unhashable key",
                key_node.start_mark,
            ) from exc
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def join_path(path: str, element: Any) -> str:
    """``path`` extended by a key (``a.b``) or a list index (``a[0]``)."""
    if isinstance(element, int):
        return f"{path}[{element}]"
    return f"{path}.{element}" if path else str(element)


def key_lines(text: str, loader: type[StrictLoader] = StrictLoader) -> dict[str, int]:
    """The 1-based line of every mapping key and list item of YAML ``text``, by field path
    (``method[0].fault.rank``); empty when ``text`` does not parse."""
    try:
        root = yaml.compose(text, Loader=loader)
    except (yaml.YAMLError, RecursionError):
        return {}
    lines: dict[str, int] = {}
    _index_lines(root, "", lines)
    return lines


def line_of(path: str, lines: dict[str, int]) -> int | None:
    """The line of field ``path``, or of its nearest enclosing key (a missing field); None
    when neither is in ``lines`` (:func:`key_lines`)."""
    while path and path not in lines:
        parent = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path)
        path = "" if parent == path else parent  # a top-level key: no enclosing key
    return lines.get(path)


def _index_lines(node: yaml.Node | None, path: str, out: dict[str, int]) -> None:
    """Record the 1-based line of every mapping key and sequence item under ``node``."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = join_path(path, key_node.value)
            out.setdefault(child, key_node.start_mark.line + 1)
            _index_lines(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = join_path(path, index)
            out.setdefault(child, item.start_mark.line + 1)
            _index_lines(item, child, out)


def yaml_problem(exc: yaml.YAMLError, text: str | None = None) -> str:
    """A YAML error in one line: the problem and where (``... at line 3, column 5``).

    ``text``: the document read, for the line and column of a character YAML refuses
    (PyYAML's :class:`yaml.reader.ReaderError` gives only its offset, and names the
    document ``"<unicode string>"``)."""
    if isinstance(exc, yaml.reader.ReaderError):
        return _reader_problem(exc, text)
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        where = f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
        context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and opened is not None and opened.line != mark.line:
            where += f" ({context} opened at line {opened.line + 1}, column {opened.column + 1})"
        return where
    return str(exc).replace("\n", " ")


#: What YAML counts as a line break (YAML 1.1, 5.4), for a refused character's line.
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


def _reader_place(exc: yaml.reader.ReaderError, text: str | None) -> tuple[int, int] | None:
    """(line, column), from 1, of the character a ReaderError refused; None without text."""
    if text is None or not 0 <= exc.position <= len(text):
        return None
    lines = _LINE_BREAK.split(text[: exc.position])
    return len(lines), len(lines[-1]) + 1


def yaml_error_line(exc: yaml.YAMLError, text: str | None = None) -> int | None:
    """The line (from 1) a YAML error is at, for a ``file:line:`` prefix; None when unknown."""
    if isinstance(exc, yaml.reader.ReaderError):
        place = _reader_place(exc, text)
        return None if place is None else place[0]
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def _reader_problem(exc: yaml.reader.ReaderError, text: str | None) -> str:
    """``character U+0000 (NUL) at line 2, column 8: YAML allows only printable
    characters, tab and line breaks; remove it`` (YAML 1.1, 5.1: the printable set)."""
    code = exc.character if isinstance(exc.character, int) else ord(exc.character)
    char = chr(code)
    fallback = "a control character" if unicodedata.category(char) == "Cc" else "not printable"
    name = unicodedata.name(char, "NUL" if code == 0 else fallback)
    place = _reader_place(exc, text)
    where = f"at character {exc.position + 1}"
    if place is not None:
        where = f"at line {place[0]}, column {place[1]}"
    return (
        f"character U+{code:04X} ({name}) {where}: YAML allows only printable characters, tab "
        "and line breaks; remove it"
    )


__all__ = [
    "StrictLoader",
    "UniqueKeyLoader",
    "join_path",
    "key_lines",
    "line_of",
    "yaml_error_line",
    "yaml_mapping",
    "yaml_problem",
]
