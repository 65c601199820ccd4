"""``stormwatch alerts config inventory``: the expected inventory as a rule file Prometheus
evaluates (real promtool), and one-line errors for bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from stormwatch.alerts import INVENTORY_METRIC, run_rule_tests


def _inventory(kit: Any, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kit.stormwatch, "alerts", "config", "inventory", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_inventory_records_one_series_per_node_in_prometheus(kit: Any, tmp_path: Path) -> None:
    out = tmp_path / "inventory.yml"
    done = _inventory(
        kit, "--node", "gpu-1", "--nodes-file", "-", "-o", str(out), stdin="gpu-2\n# spare\ngpu-1\n"
    )
    assert done.returncode == 0, done.stderr
    test = tmp_path / "inventory_test.yml"
    test.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(out)],
                "evaluation_interval": "15s",
                "tests": [
                    {
                        "interval": "15s",
                        "input_series": [],
                        "promql_expr_test": [
                            {
                                "expr": INVENTORY_METRIC,
                                "eval_time": "1m",
                                "exp_samples": [
                                    {"labels": f'{INVENTORY_METRIC}{{node="{n}"}}', "value": 1}
                                    for n in ("gpu-1", "gpu-2")
                                ],
                            }
                        ],
                    }
                ],
            }
        )
    )
    run = run_rule_tests([test])
    assert run.ok, run.output


def test_inventory_without_nodes_or_with_a_bad_name_is_a_one_line_error(kit: Any) -> None:
    for args, stdin, words in [
        ((), "", ("--node", "names no node")),
        (("--nodes-file", "-"), "gpu-1 gpu-2\n", ("--nodes-file", "'gpu-1 gpu-2'", "one node")),
    ]:
        done = _inventory(kit, *args, stdin=stdin)
        assert done.returncode == 2, done
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert all(w in done.stderr for w in words), done.stderr
