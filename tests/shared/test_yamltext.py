"""YAML errors in one line that say where and what to do (stormwatch.yamltext)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stormwatch.errors import ConfigError
from stormwatch.yamltext import yaml_mapping, yaml_problem

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('a: 1\nb: "x\0y"\n', "character U+0000 (NUL) at line 2, column 6"),
        ("\0", "character U+0000 (NUL) at line 1, column 1"),
        ("a: 1\x01\n", "character U+0001 (a control character) at line 1, column 5"),
        # breaker, second pass: lone CRs and U+2028 are YAML line breaks too
        ("t: x\rd: y\rbad: a\x01\r", "character U+0001 (a control character) at line 3, column 7"),
        ("t: x\r\nbad: \x02", "character U+0002 (a control character) at line 2, column 6"),
        ("t: x\u2028b: \x03", "character U+0003 (a control character) at line 2, column 4"),
        # a noncharacter (a byte-swapped BOM) is not a control character
        ("bad: \ufffe", "character U+FFFE (not printable) at line 1, column 6"),
    ],
)
def test_a_character_yaml_refuses_is_named_with_its_line_and_column(
    text: str, expected: str
) -> None:
    # breaker's finding: PyYAML names the document "<unicode string>" and gives an offset
    with pytest.raises(yaml.YAMLError) as caught:
        yaml.safe_load(text)
    problem = yaml_problem(caught.value, text)
    assert problem.startswith(expected + ": YAML allows only printable characters"), problem
    assert problem.endswith("remove it") and "<unicode string>" not in problem
    assert "\n" not in yaml_problem(caught.value)  # without the text: its offset, one line


def test_every_settings_file_reader_names_the_file_and_the_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        yaml_mapping("users:\n  ann: \0\n", "web config /etc/web.yml")
    assert str(caught.value) == (
        "web config /etc/web.yml: not valid YAML: character U+0000 (NUL) at line 2, column 8: "
        "YAML allows only printable characters, tab and line breaks; remove it"
    )
    experiment = tmp_path / "nul.yaml"
    experiment.write_text('version: 1\ntitle: "x\0y"\n')
    done = subprocess.run(
        [STORMWATCH, "chaos", "validate", str(experiment)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "character U+0000 (NUL) at line 2, column 10" in done.stderr, done.stderr
    assert f"{experiment}:2: not valid YAML" in done.stderr  # file:line, for an editor
