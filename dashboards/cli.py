"""``stormwatch dashboards``: build Grafana dashboards and provisioning files, push them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from stormwatch.errors import ConfigError
from stormwatch.urls import is_http_url

#: Environment variable holding the Grafana service-account token for ``push``.
TOKEN_ENV = "GRAFANA_TOKEN"


@click.group("dashboards", context_settings={"help_option_names": ["-h", "--help"]})
def dashboards() -> None:
    """Grafana dashboards as code (grafana-foundation-sdk): build files or push to Grafana."""


@dashboards.command("build")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write dashboards/*.json and provisioning/{dashboards,datasources}/*.yaml to.",
)
@click.option(
    "--prometheus-url",
    default="http://127.0.0.1:19090",
    show_default=True,
    help="URL of the Prometheus written into the provisioned data source.",
)
@click.option(
    "--scrape-interval",
    default=None,
    metavar="DURATION",
    help="That Prometheus' scrape interval (e.g. 30s), the data source's timeInterval; "
    "default: Grafana's own.",
)
def build_cmd(out_dir: Path, prometheus_url: str, scrape_interval: str | None) -> None:
    """Write every dashboard as deterministic JSON plus Grafana provisioning files.

    Point Grafana's provisioning folder (paths.provisioning) at OUT/provisioning.
    """
    from stormwatch.dashboards.render import write

    for path in write(out_dir, prometheus_url, scrape_interval=scrape_interval):
        click.echo(str(path))


@dashboards.command("push")
@click.option("--url", required=True, help="Grafana base URL, e.g. http://127.0.0.1:3000.")
@click.option(
    "--folder", default=None, help="Folder title (created when missing); default General."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds per HTTP request.",
)
def push_cmd(url: str, folder: str | None, timeout: float) -> None:
    """Create or update the dashboards on a Grafana; unchanged ones are left alone.

    The service-account token is read from the environment variable GRAFANA_TOKEN.
    """
    if not math.isfinite(timeout):  # click's FloatRange lets nan and inf through
        raise click.BadParameter(
            f"{timeout} is not a finite number of seconds", param_hint="'--timeout'"
        )
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(
            f"{TOKEN_ENV} is not set: export {TOKEN_ENV}=<Grafana service-account token> "
            "(Administration > Service accounts, role Editor)"
        )
    if not is_http_url(url):
        raise ConfigError(f"--url: {url!r} is not an http(s) URL")
    from stormwatch.dashboards.push import push
    from stormwatch.dashboards.render import build_all

    results = push(url, token, build_all(), folder=folder, timeout=timeout)
    table = Table("dashboard", "uid", "result")
    for result in results:
        table.add_row(result.title, result.uid, result.outcome)
    Console().print(table)
