"""Checks made before ``lab up`` creates anything, each failing with the reason and the fix."""

from __future__ import annotations

import os
from pathlib import Path

from stormwatch.lab.config import LabConfig
from stormwatch.lab.errors import LabError, LabPermissionError, PortInUseError
from stormwatch.lab.netns import NetworkLayer
from stormwatch.lab.services.definitions import (
    ALERTMANAGER_BINARY,
    PROMETHEUS_BINARY,
    find_binary,
)
from stormwatch.lab.slurm import daemons
from stormwatch.ports import port_is_free  # the one home of ports; re-exported here

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def effective_capabilities(status_file: Path = Path("/proc/self/status")) -> int:
    """The calling process's effective capability set (bit mask; 0 when unreadable)."""
    try:
        for line in status_file.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (
        OSError,
        ValueError,
        IndexError,
    ):  # unreadable: none, and the caller names what is missing
        return 0
    return 0


def require_privileges(action: str) -> None:
    """Raise :class:`LabPermissionError` unless we may create namespaces and links.

    Args:
        action: what the caller is about to do, for the message (``"lab up"``).
    """
    # Capabilities rather than the uid: root in a restricted container may lack them.
    caps = effective_capabilities()
    if caps & (1 << CAP_NET_ADMIN) and caps & (1 << CAP_SYS_ADMIN):
        return
    who = "root without the needed capabilities" if os.geteuid() == 0 else "not root"
    raise LabPermissionError(
        f"{action} needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN): it creates network "
        "namespaces, a bridge and veth pairs and runs processes inside the namespaces; "
        f"run it with sudo (this process is {who})"
    )


def require_binaries(config: LabConfig | None = None) -> None:
    """The external programs the lab runs are installed (Slurm's and munge's too when
    ``config.slurm``; :class:`~stormwatch.lab.errors.SlurmError` names the packages)."""
    find_binary("ip", "iproute2")
    find_binary(PROMETHEUS_BINARY, "prometheus")
    find_binary(ALERTMANAGER_BINARY, "prometheus-alertmanager")
    if config is not None and config.slurm:
        daemons.require_tools()
        daemons.munge_account()


def require_free_ports(config: LabConfig) -> None:
    """The root-namespace ports of Prometheus, Alertmanager, the responder and (with
    ``config.slurm``) slurmctld are free."""
    wanted = {
        "prometheus": ("prometheus_port", config.prometheus_port),
        "alertmanager": ("alertmanager_port", config.alertmanager_port),
        "responder": ("responder_port", config.responder_port),
    }
    if config.slurm:  # slurmctld listens on every address of the root namespace
        wanted["slurmctld"] = ("slurmctld_port", config.slurmctld_port)
    for service, (field, port) in wanted.items():
        if not port_is_free(port, "0.0.0.0" if service == "slurmctld" else "127.0.0.1"):
            raise PortInUseError(
                f"port 127.0.0.1:{port} for {service} is already in use (another lab, or "
                f"another program); stop it or choose another LabConfig.{field} "
                f"(--{field.replace('_', '-')})"
            )


def require_unused_names(config: LabConfig, network: NetworkLayer) -> None:
    """No link or namespace with this lab's names exists, and the subnet is not in use."""
    taken = [n for n in network.namespaces() if config.owns_netns(n)]
    taken += [n for n in network.links() if config.owns_link(n)]
    if taken:
        raise LabError(
            f"{', '.join(sorted(taken))} already exist(s): another lab with prefix "
            f"{config.prefix!r} is up (see `stormwatch lab status --run-dir ...`); bring it "
            "down with `stormwatch lab down` for its run directory, or choose another --prefix"
        )
    for link, address in network.addresses():
        if address.network.overlaps(config.subnet):
            raise LabError(
                f"subnet {config.subnet} overlaps {address} on {link}; choose another --subnet"
            )


__all__ = [
    "effective_capabilities",
    "port_is_free",
    "require_binaries",
    "require_free_ports",
    "require_privileges",
    "require_unused_names",
]
