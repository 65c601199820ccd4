"""``stormwatch alerts``: rule files, Alertmanager configuration and the responder."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from stormwatch.alerts.actions.confirm_restart import ConfirmRestartSettings
from stormwatch.alerts.alertmanager import (
    AlertmanagerSettings,
    render_alertmanager_config,
    write_alertmanager_config,
)
from stormwatch.alerts.incident_report.cli import postmortem_cmd
from stormwatch.alerts.incidents_table import incidents_table, read_store
from stormwatch.alerts.inventory import inventory_cmd
from stormwatch.alerts.policy import default_policy, load_policy
from stormwatch.alerts.responder.auth import read_token
from stormwatch.alerts.responder.service import serve
from stormwatch.alerts.responder.settings import DEFAULT_MAX_BODY_BYTES, ResponderSettings
from stormwatch.alerts.rulefiles import (
    check_rules,
    render_rules_cmd,
    rule_files,
    rules_dir,
    run_rule_tests,
)
from stormwatch.clients import ResponderClient
from stormwatch.clients.http import HttpOptions
from stormwatch.contracts.responder import ActionRecord, IncidentRecord
from stormwatch.durations import parse_duration
from stormwatch.errors import ConfigError
from stormwatch.platforms import PlatformSettings, load_platform_settings, load_target_file


def _host_port(value: str, option: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{option}: {value!r} must be HOST:PORT, e.g. 127.0.0.1:19095")
    return host, int(port)


@click.group("alerts")
def alerts() -> None:
    """Alert rules, Alertmanager configuration and the responder.

    \b
    stormwatch alerts check                 promtool check + unit tests of the shipped rules
    stormwatch alerts rules-path            folder of the shipped rule files (for Prometheus)
    stormwatch alerts render-rules --out D  the rule files with your runbook base URL
    stormwatch alerts config alertmanager   write alertmanager.yml pointing at the responder
    stormwatch alerts config inventory      write the expected inventory (nodes with agents)
    stormwatch alerts serve                 run the responder (webhook receiver + actions)
    stormwatch alerts incidents             list the responder's incidents
    stormwatch alerts approve ACTION_ID     approve an action waiting for approval
    stormwatch alerts policy-check FILE     validate a runbook policy file
    stormwatch alerts postmortem INCIDENT   (re-)write an incident's post-mortem
    """


@alerts.command("rules-path")
def rules_path_cmd() -> None:
    """Print the folder holding the shipped Prometheus rule files (*.yml).

    Prometheus loads them with `rule_files: ["<folder>/*.yml"]`.
    """
    click.echo(str(rules_dir()))


@alerts.command("check")
def check_cmd() -> int:
    """Run `promtool check rules` and `promtool test rules` on the shipped rules.

    Exit status 0 when both pass, 1 otherwise (promtool's output is printed).
    """
    runs = [check_rules(), run_rule_tests()]
    for run in runs:
        click.echo(f"$ {' '.join(run.command)}")
        click.echo(run.output.rstrip())
    ok = all(run.ok for run in runs)
    files = ", ".join(p.name for p in rule_files())
    click.secho(
        f"{'ok' if ok else 'FAILED'}: rules {files}", fg="green" if ok else "red", err=not ok
    )
    return 0 if ok else 1


@alerts.group("config")
def config_group() -> None:
    """Generate configuration for the services around the responder."""


@config_group.command("alertmanager")
@click.option(
    "--responder-url",
    required=True,
    help="Responder base URL (e.g. http://127.0.0.1:19095); /v1/alertmanager is appended "
    "unless the URL already ends with it.",
)
@click.option(
    "--token-file",
    required=True,
    type=click.Path(path_type=Path),
    help="File with the responder's Bearer token; Alertmanager reads it (credentials_file).",
)
@click.option(
    "--group-wait",
    default="30s",
    show_default=True,
    help="Wait before the first notification of a group (Alertmanager's default; the lab "
    "passes its own, 1s).",
)
@click.option(
    "--group-interval",
    default="5m",
    show_default=True,
    help="Wait between notifications of a changed group; also delays 'resolved' "
    "(Alertmanager's default; the lab passes its own).",
)
@click.option(
    "--repeat-interval",
    default="4h",
    show_default=True,
    help="Re-send an unchanged firing group after this long.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
def alertmanager_cmd(
    responder_url: str,
    token_file: Path,
    group_wait: str,
    group_interval: str,
    repeat_interval: str,
    output: Path | None,
) -> None:
    """Print (or write) alertmanager.yml: group by alertname and training_job, one webhook
    receiver (the responder) with send_resolved and Bearer authorization."""
    settings = AlertmanagerSettings(
        responder_url=responder_url,
        token_file=token_file,
        group_wait_s=parse_duration(group_wait, "--group-wait"),
        group_interval_s=parse_duration(group_interval, "--group-interval"),
        repeat_interval_s=parse_duration(repeat_interval, "--repeat-interval"),
    )
    text = render_alertmanager_config(settings)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_alertmanager_config(settings, output)
        click.echo(f"wrote {output}", err=True)


config_group.add_command(inventory_cmd)


@alerts.command("serve")
@click.option(
    "--listen",
    default="127.0.0.1:19095",
    show_default=True,
    help="HOST:PORT to listen on (port 0 picks a free port).",
)
@click.option(
    "--db",
    "db_path",
    required=True,
    type=click.Path(path_type=Path),
    help="SQLite database of notifications, incidents and actions (created if missing).",
)
@click.option(
    "--token-file",
    required=True,
    type=click.Path(path_type=Path),
    help="File with the Bearer token every request (except /healthz) must carry.",
)
@click.option(
    "--prometheus-url",
    default=None,
    help="Prometheus base URL for read-only actions (confirm_restart); "
    "without it they are skipped.",
)
@click.option(
    "--confirm-timeout",
    default="5m",
    show_default=True,
    help="How long confirm_restart waits for the restart and fresh progress.",
)
@click.option(
    "--max-body-bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=int,
    help="Largest accepted request body; larger ones get 413.",
)
@click.option(
    "--policy",
    "policy_file",
    default=None,
    type=click.Path(path_type=Path),
    help="Runbook policy YAML (alert -> actions, guards); default: "
    "StormwatchRankStalled -> confirm_restart only.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Remedial actions only record what they would do (overrides the policy's dry_run).",
)
@click.option(
    "--audit-jsonl",
    default=None,
    type=click.Path(path_type=Path),
    help="JSONL copy of the audit log [default: <db>.audit.jsonl].",
)
@click.option(
    "--lab-run-dir",
    default=None,
    type=click.Path(path_type=Path),
    help="The lab's run directory: enables the lab backend for remedial actions and gives "
    "post-mortems the job's rank logs, dumps, spans, agent events and chaos journals.",
)
@click.option(
    "--platform",
    type=click.Choice(["lab", "kubernetes", "slurm"]),
    default="lab",
    show_default=True,
    help="Platform backend of the remedial actions (docs/deploy-kubernetes.md, "
    "docs/deploy-slurm.md).",
)
@click.option(
    "--platform-config",
    default=None,
    type=click.Path(path_type=Path),
    help="YAML with the kubernetes:/slurm: backend settings (namespace, nproc_per_node, ...).",
)
@click.option(
    "--target",
    "target_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Target file (docs/deploy-slurm.md, 'Run game days on your cluster'): its platform "
    "and slurm:/kubernetes: settings, its Prometheus (unless --prometheus-url) and, with a "
    "lab: section (the file `lab up` writes), the lab's run dir (unless --lab-run-dir): on "
    "the Slurm lab, Slurm jobs are remediated through Slurm and the jobs the lab launched "
    "directly through their processes. Excludes --platform/--platform-config.",
)
@click.option(
    "--postmortem-dir",
    default=None,
    type=click.Path(path_type=Path),
    help="Write a post-mortem into <dir>/incident-<id>/ when an incident closes "
    "[default: <db folder>/postmortems].",
)
@click.option("--no-postmortems", is_flag=True, help="Write no post-mortem when incidents close.")
def serve_cmd(
    listen: str,
    db_path: Path,
    token_file: Path,
    prometheus_url: str | None,
    confirm_timeout: str,
    max_body_bytes: int,
    policy_file: Path | None,
    dry_run: bool,
    audit_jsonl: Path | None,
    lab_run_dir: Path | None,
    platform: str,
    platform_config: Path | None,
    target_file: Path | None,
    postmortem_dir: Path | None,
    no_postmortems: bool,
) -> None:
    """Run the responder: receive Alertmanager webhooks, keep incidents, run actions, and
    write a post-mortem when an incident closes.

    Prints `listening on URL` once ready; stops cleanly on SIGINT/SIGTERM.
    """
    host, port = _host_port(listen, "--listen")
    policy = default_policy() if policy_file is None else load_policy(policy_file, field="--policy")
    if dry_run:
        policy = policy.model_copy(update={"dry_run": True})
    platform_settings = PlatformSettings()
    prometheus_http: HttpOptions | None = None
    if target_file is not None:
        _refuse_platform_options(click.get_current_context())
        target = load_target_file(target_file)
        platform, platform_settings = target.platform, target.platform_settings()
        if target.prometheus is not None and prometheus_url is None:
            prometheus_url, prometheus_http = target.prometheus.url, target.prometheus.http
        if target.lab is not None and lab_run_dir is None:
            lab_run_dir = target.lab.run_dir
    elif platform_config is not None:
        platform_settings = load_platform_settings(platform_config)
    settings = ResponderSettings(
        policy=policy,
        audit_jsonl=audit_jsonl,
        lab_run_dir=lab_run_dir,
        postmortem_dir=postmortem_dir,
        postmortems=not no_postmortems,
        platform=platform,
        platform_settings=platform_settings,
        db_path=db_path,
        token_file=token_file,
        host=host,
        port=port,
        prometheus_url=prometheus_url,
        prometheus_http=prometheus_http,
        max_body_bytes=max_body_bytes,
        confirm=ConfirmRestartSettings(
            timeout_s=parse_duration(confirm_timeout, "--confirm-timeout")
        ),
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(settings, stop=stop, on_ready=lambda url: click.echo(f"listening on {url}"))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                # The loop is ending with the process: a handler it cannot remove goes with it.
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    asyncio.run(main())


def _refuse_platform_options(ctx: click.Context) -> None:
    """``--target`` gives the platform and its settings: refuse ``--platform`` and
    ``--platform-config`` given with it (before reading either file).

    Raises:
        click.UsageError: naming the options given.
    """
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("platform", "platform_config")
        if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)
    ]
    if given:
        raise click.UsageError(
            f"--target gives the platform and its settings; {' and '.join(given)} would "
            "conflict with it: give either --target or --platform/--platform-config"
        )


#: The local lab's responder token (``stormwatch lab up`` writes it), the default for the
#: read and approve commands so that they work against the lab without options.
_LAB_TOKEN = str(Path(os.environ.get("STORMWATCH_LAB_DIR", "run")) / "secrets" / "responder.token")


def _responder_client_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--url`` and ``--token-file`` of the commands that talk to a running responder."""
    command = click.option(
        "--token-file",
        default=_LAB_TOKEN,
        show_default=True,
        envvar="STORMWATCH_RESPONDER_TOKEN_FILE",
        type=click.Path(path_type=Path),
        help="File with the responder's Bearer token; the default is the local lab's "
        "(`$STORMWATCH_LAB_DIR/secrets/responder.token`).",
    )(command)
    return click.option(
        "--url", default="http://127.0.0.1:19095", show_default=True, help="Responder base URL."
    )(command)


def _responder_token(token_file: Path, *, has_db: bool = False) -> str:
    """The responder's token from ``--token-file``; when the local lab's default file is
    missing, the error says what to give instead (a lab, the responder's URL and token, and
    ``--db`` for a command that has it: ``has_db``).
    Raises: ConfigError: the file cannot be read (see :func:`read_token`).
    """
    if token_file == Path(_LAB_TOKEN) and not token_file.exists():
        raise ConfigError(
            f"--token-file: {token_file} does not exist: no local lab is up in "
            f"{token_file.parent.parent} (start one with `stormwatch lab up`, or set "
            "STORMWATCH_LAB_DIR to its run directory); for another responder give --url and "
            "--token-file" + (", or read its database with --db" if has_db else "")
        )
    return read_token(token_file, "--token-file")


@alerts.command("incidents")
@_responder_client_options
@click.option(
    "--db",
    "db_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Read the responder's SQLite database (its `alerts serve --db` file) instead of "
    "asking the running responder; read-only, works while it is down. --url and "
    "--token-file are then not used.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON ({incidents, actions}) instead of a table."
)
def incidents_cmd(url: str, token_file: Path, db_path: Path | None, as_json: bool) -> None:
    """List the responder's incidents (one per alert group episode) with their actions.

    \b
    first rank  the `rank` label of the alert that fired first ("tied" when
                another alert of the incident started at the same time)
    alerts      how many alerts (ranks) the incident gathered

    One line per incident; on a terminal narrower than 120 columns the job and
    closed columns are left out, the start time becomes an age, and long cells
    end in "…" (--json has everything).
    """
    from rich.console import Console

    if db_path is not None:
        ctx = click.get_current_context()
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("url", "token_file")
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(
                f"--db reads the database directly; {' and '.join(given)} would not be used: "
                "give either --db or --url/--token-file"
            )
        incidents, actions = read_store(db_path)
        source = str(db_path)
    else:
        client = ResponderClient(url, token=_responder_token(token_file, has_db=True))

        async def fetch() -> tuple[list[IncidentRecord], list[ActionRecord]]:
            return await asyncio.gather(client.incidents(), client.actions())

        incidents, actions = asyncio.run(fetch())
        source = url
    if as_json:
        click.echo(
            json.dumps(
                {
                    "incidents": [i.model_dump(mode="json") for i in incidents],
                    "actions": [a.model_dump(mode="json") for a in actions],
                },
                indent=2,
            )
        )
        return
    console = Console()
    if incidents:
        console.print(incidents_table(incidents, actions, source, console.width))
    else:
        console.print(f"No incidents in {source}." if db_path else f"No incidents at {source}.")


@alerts.command("approve")
@click.argument("action_id", type=int)
@_responder_client_options
@click.option(
    "--actor",
    default=None,
    help="Who approves (recorded in the audit log) [default: $USER].",
)
def approve_cmd(action_id: int, url: str, token_file: Path, actor: str | None) -> None:
    """Approve ACTION_ID, a destructive action waiting for approval (see the policy's
    guards.approval_required); the audit log records who approved it."""
    import getpass

    client = ResponderClient(url, token=_responder_token(token_file))
    who = actor or getpass.getuser()
    asyncio.run(client.approve(action_id, actor=who))
    click.echo(f"approved action {action_id} as {who}")


@alerts.command("policy-check")
@click.argument("policy_file", type=click.Path(path_type=Path))
def policy_check_cmd(policy_file: Path) -> None:
    """Validate a runbook policy file and print the alert -> actions mapping."""
    policy = load_policy(policy_file, field="POLICY_FILE")
    for rule in policy.rules:
        click.echo(f"{rule.alertname}: {', '.join(rule.actions)}")
    click.echo(f"ok: {len(policy.rules)} rules, dry_run={str(policy.dry_run).lower()}")


alerts.add_command(postmortem_cmd)
alerts.add_command(render_rules_cmd)


__all__ = ["alerts"]
