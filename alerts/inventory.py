"""``stormwatch alerts config inventory``: write the expected inventory, the nodes that must
run an agent, as a Prometheus rule file (:mod:`stormwatch.contracts.inventory`)."""

from __future__ import annotations

from pathlib import Path

import click

from stormwatch.contracts.inventory import parse_nodes, render_inventory, write_inventory
from stormwatch.errors import ConfigError


@click.command("inventory")
@click.option("--node", "node_names", multiple=True, help="A node that must run an agent.")
@click.option(
    "--nodes-file",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=None,
    help="File with one node name per line ('-': standard input), e.g. the output of "
    "`sinfo -h -N -o %N -p gpu`.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write to this file instead of standard output.",
)
def inventory_cmd(
    node_names: tuple[str, ...], nodes_file: Path | None, output: Path | None
) -> None:
    """Print (or write) the expected inventory: a Prometheus rule file recording
    stormwatch_inventory_agent_expected{node} for each node that must run an agent.
    Add it to Prometheus' rule_files next to the shipped rules and reload Prometheus
    when the nodes change."""
    nodes = parse_nodes(node_names, source="--node")
    if nodes_file is not None:
        try:
            with click.open_file(str(nodes_file), encoding="utf-8") as lines:  # "-": stdin
                text = lines.read()
        except OSError as exc:
            raise ConfigError(
                f"--nodes-file: cannot read {nodes_file}: {exc.strerror or exc}"
            ) from exc
        listed = parse_nodes(text.splitlines(), source=f"--nodes-file {nodes_file}")
        nodes = parse_nodes([*nodes, *listed], source="--node")
    if output is None:
        click.echo(render_inventory(nodes), nl=False)
    else:
        write_inventory(nodes, output)
        click.echo(f"wrote {output} ({len(nodes)} nodes)", err=True)


__all__ = ["inventory_cmd"]
