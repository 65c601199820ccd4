"""The runbook policy file: validation errors name the file and field; the default policy."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from stormwatch.alerts.actions.playbook import playbook_from_policy
from stormwatch.alerts.policy import default_policy, load_policy, parse_policy
from stormwatch.errors import ConfigError

GOOD = """
dry_run: true
guards:
  restart_budget: {max_actions: 2, window: 30m}
  rate_limit: {max_actions: 5, window: 1m}
  circuit_breaker: {failures: 2, cooldown: 5m}
  max_concurrent: 1
  approval_required: [exclude_node_restart]
rules:
  - alertname: StormwatchRankStalled
    actions: [confirm_restart]
  - alertname: StormwatchRankCrashLoop
    actions: [collect_diagnostics, exclude_node_restart]
"""


def test_a_full_policy_parses_with_durations_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "policy.yml"
    path.write_text(GOOD)
    policy = load_policy(path)
    assert policy.dry_run is True
    assert policy.guards.restart_budget.window == 1800.0
    assert policy.guards.circuit_breaker.cooldown == 300.0
    assert policy.kinds_for("StormwatchRankCrashLoop") == (
        "collect_diagnostics",
        "exclude_node_restart",
    )
    assert policy.kinds_for("Unknown") == ()


def test_default_policy_only_confirms_restarts_of_stalled_ranks() -> None:
    """The lab's kill-rank demo: torchrun restarts the workers itself."""
    policy = default_policy()
    assert [(r.alertname, r.actions) for r in policy.rules] == [
        ("StormwatchRankStalled", ("confirm_restart",))
    ]
    assert policy.dry_run is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rulez: []", "policy.yml: rulez: unknown key; valid keys: dry_run, guards, rules"),
        (
            "guards: {rate_limit: {max_actions: 1, window: 1m, burst: 2}}",
            "guards.rate_limit.burst: unknown key; valid keys: max_actions, window",
        ),
        (
            "guards: {max_concurent: 1}",
            "guards.max_concurent: unknown key; valid keys: approval_required, approval_timeout,"
            " circuit_breaker, max_concurrent, rate_limit, restart_budget",
        ),
        (
            "rules: [{alertname: A, actions: [notify_only], severity: x}]",
            "rules.0.severity: unknown key; valid keys: actions, alertname",
        ),
        ("rules: [{alertname: A, actions: [reboot]}]", "rules.0.actions.0: Input should be"),
        ("guards: {rate_limit: {max_actions: 1, window: 1x}}", "guards.rate_limit.window"),
        ("guards: {max_concurrent: 0}", "guards.max_concurrent"),
        (
            "rules: [{alertname: A, actions: [notify_only]}, {alertname: A, actions: [notify_only]}]",
            "appears more than once",
        ),
        ("rules: [{alertname: A, actions: [notify_only, notify_only]}]", "repeat a kind"),
        ("- just a list", "policy.yml: must be a mapping"),
        # Breaker pass (stop 36): an empty file passed as no rules, and `alerts serve --policy`
        # with it turned every remediation off without a word.
        ("", "policy.yml: empty; a policy names its rules"),
        ("# all commented out\n", "write `rules: []` for a responder that runs no action"),
        ("{}", "policy.yml: empty"),
        ("rules: [", "policy.yml: not valid YAML"),
        (  # one line, with where (fresh-user pass: PyYAML's five lines and "<unicode string>")
            "rules:\n  - alertname: X\n    actions: [a\n",
            "not valid YAML: expected ',' or ']', but got '<stream end>' at line 4, column 1 "
            "(while parsing a flow sequence opened at line 3, column 14)",
        ),
        (  # YAML keeps the last of two equal keys silently: the first guards were lost
            "guards: {max_concurrent: 1}\nrules: []\nguards: {max_concurrent: 5}\n",
            "not valid YAML: duplicate key 'guards' at line 3, column 1",
        ),
        ("? [a, b]\n: 1\n", "not valid YAML: found unhashable key at line 1, column 3"),
    ],
)
def test_invalid_policy_names_file_and_field(text: str, expected: str) -> None:
    assert parse_policy("rules: []").rules == ()  # no action, said so: still accepted
    with pytest.raises(ConfigError) as err:
        parse_policy(text, origin="policy.yml")
    assert str(err.value).startswith("policy.yml: ")
    assert expected in str(err.value)
    assert "\n" not in str(err.value) and "<unicode string>" not in str(err.value)


def test_merge_keys_still_share_settings_and_an_explicit_key_overrides_a_merged_one() -> None:
    """Refusing duplicate keys must not refuse YAML's merge keys (breaker's finding)."""
    policy = parse_policy(
        "rules:\n"
        "  - &first {alertname: A, actions: [notify_only]}\n"
        "  - {<<: *first, alertname: B}\n",
        origin="policy.yml",
    )
    assert [r.alertname for r in policy.rules] == ["A", "B"]


def test_backend_actions_without_a_backend_are_refused() -> None:
    policy = parse_policy("rules: [{alertname: A, actions: [restart_workers]}]")
    with pytest.raises(ConfigError, match=r"restart_workers.*--lab-run-dir"):
        playbook_from_policy(policy, prometheus=None, backend=None)


def test_policy_check_cli_prints_rules_and_rejects_bad_files(kit: Any, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(GOOD)
    bad.write_text("rules: [{alertname: A, actions: [reboot]}]")
    out = subprocess.run(
        [kit.stormwatch, "alerts", "policy-check", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "StormwatchRankCrashLoop: collect_diagnostics, exclude_node_restart" in out.stdout
    out = subprocess.run(
        [kit.stormwatch, "alerts", "policy-check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert f"{bad}: rules.0.actions.0" in out.stderr and "Traceback" not in out.stderr


def test_a_missing_policy_file_is_named_as_the_user_gave_it(kit: Any, tmp_path: Path) -> None:
    """policy-check takes the file as an argument, serve as --policy: each error names its own."""
    missing = tmp_path / "missing.yml"
    token = tmp_path / "token"
    token.write_text("t\n")
    serve = [kit.stormwatch, "alerts", "serve", "--db", str(tmp_path / "r.sqlite"),
             "--token-file", str(token), "--listen", "127.0.0.1:0", "--policy", str(missing)]  # fmt: skip
    runs = {
        "POLICY_FILE": [kit.stormwatch, "alerts", "policy-check", str(missing)],
        "--policy": serve,
    }
    for field, argv in runs.items():
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines() == [
            f"error: {field}: cannot read {missing}: No such file or directory; "
            "give the path of a runbook policy YAML file"
        ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]
