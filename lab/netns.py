"""The network layer of the lab: bridge, namespaces, veth pairs (iproute2).

:class:`NetworkLayer` is the seam; :class:`IpRoute2` implements it with the
``ip`` command. Every ``delete_*`` is idempotent (a missing object is not an
error), because ``lab down`` must be safe to run twice and after a crash.

Each namespace also gets ``/etc/netns/<ns>/hosts`` and ``resolv.conf``, which
``ip netns exec`` bind-mounts over ``/etc``. Without them, the c10d store's
reverse lookups of peer addresses wait for the host's DNS server (unreachable
from the namespace) and a torchrun rendezvous takes ~35 s instead of ~5 s
(measured on the lab machine).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from stormwatch.lab.errors import LabError

log = logging.getLogger(__name__)

NETNS_ETC = Path("/etc/netns")


class NetworkLayer(Protocol):
    """What the lab needs from the kernel's network stack."""

    def links(self) -> list[str]:
        """Names of the links in the root namespace."""
        ...

    def namespaces(self) -> list[str]:
        """Names of the named network namespaces."""
        ...

    def addresses(self) -> list[tuple[str, ipaddress.IPv4Interface]]:
        """(link, address) of every IPv4 address in the root namespace."""
        ...

    def add_bridge(self, name: str, address: ipaddress.IPv4Interface) -> None: ...

    def add_namespace(self, name: str, hosts: Mapping[str, str]) -> None:
        """Create namespace ``name`` with loopback up and ``hosts`` (address -> name) resolvable."""
        ...

    def add_node_link(
        self,
        *,
        netns: str,
        veth: str,
        interface: str,
        bridge: str,
        address: ipaddress.IPv4Interface,
        gateway: ipaddress.IPv4Address,
    ) -> None:
        """Connect ``netns`` to ``bridge`` with a veth pair (``veth`` outside, ``interface`` inside)."""
        ...

    def delete_link(self, name: str) -> None:
        """Delete link ``name`` (nothing when it does not exist)."""
        ...

    def delete_namespace(self, name: str) -> None:
        """Delete the namespace and its ``/etc/netns`` files (nothing when it does not exist)."""
        ...

    def namespace_pids(self, name: str) -> list[int]:
        """Pids of the processes inside namespace ``name`` (empty when it does not exist)."""
        ...


class IpRoute2:
    """:class:`NetworkLayer` implemented with the ``ip`` command (needs root or CAP_NET_ADMIN).

    Args:
        ip: path of the ``ip`` binary (default: found on ``PATH``).
        etc_netns: folder for per-namespace ``hosts``/``resolv.conf`` (``/etc/netns``,
            where ``ip netns exec`` looks).
    """

    def __init__(self, ip: str | None = None, etc_netns: Path = NETNS_ETC) -> None:
        found = ip or shutil.which("ip")
        if found is None:
            raise LabError("the `ip` command (iproute2) is not installed; apt-get install iproute2")
        self._ip = found
        self._etc = etc_netns

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [self._ip, *args]
        log.debug("run %s", " ".join(cmd))
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if check and out.returncode != 0:
            raise LabError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()}")
        return out

    def _json(self, *args: str) -> list[dict[str, Any]]:
        out = self._run("-j", *args).stdout.strip()
        return json.loads(out) if out else []

    def links(self) -> list[str]:
        return [entry["ifname"] for entry in self._json("link", "show")]

    def namespaces(self) -> list[str]:
        return [entry["name"] for entry in self._json("netns", "list")]

    def addresses(self) -> list[tuple[str, ipaddress.IPv4Interface]]:
        found = []
        for entry in self._json("-4", "addr", "show"):
            for info in entry.get("addr_info", []):
                iface = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}")
                found.append((entry["ifname"], iface))
        return found

    def add_bridge(self, name: str, address: ipaddress.IPv4Interface) -> None:
        self._run("link", "add", name, "type", "bridge")
        self._run("addr", "add", str(address), "dev", name)
        self._run("link", "set", name, "up")

    def add_namespace(self, name: str, hosts: Mapping[str, str]) -> None:
        self._write_etc(name, hosts)
        self._run("netns", "add", name)
        self._run("-n", name, "link", "set", "lo", "up")

    def _write_etc(self, name: str, hosts: Mapping[str, str]) -> None:
        folder = self._etc / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        lines = [base.rstrip("\n"), "# stormwatch lab", *(f"{a} {n}" for a, n in hosts.items())]
        (folder / "hosts").write_text("\n".join(lines) + "\n")
        # No nameserver: lookups that miss the hosts file fail at once instead of timing out.
        (folder / "resolv.conf").write_text("options timeout:1 attempts:1\n")

    def add_node_link(
        self,
        *,
        netns: str,
        veth: str,
        interface: str,
        bridge: str,
        address: ipaddress.IPv4Interface,
        gateway: ipaddress.IPv4Address,
    ) -> None:
        self._run("link", "add", veth, "type", "veth", "peer", "name", interface, "netns", netns)
        self._run("link", "set", veth, "master", bridge)
        self._run("link", "set", veth, "up")
        self._run("-n", netns, "addr", "add", str(address), "dev", interface)
        self._run("-n", netns, "link", "set", interface, "up")
        self._run("-n", netns, "route", "add", "default", "via", str(gateway))

    def delete_link(self, name: str) -> None:
        self._delete(("link", "del", name), lambda: name in self.links())

    def delete_namespace(self, name: str) -> None:
        self._delete(("netns", "del", name), lambda: name in self.namespaces())
        shutil.rmtree(self._etc / name, ignore_errors=True)

    def _delete(self, args: tuple[str, ...], exists: Callable[[], bool]) -> None:
        """Run a delete; a failure only counts if the object is still there afterwards.

        A veth vanishes on its own, asynchronously, once its peer's namespace is
        destroyed, so "does not exist" races are expected and harmless.
        """
        if not exists():
            return
        out = self._run(*args, check=False)
        if out.returncode != 0 and exists():
            raise LabError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")

    def namespace_pids(self, name: str) -> list[int]:
        if name not in self.namespaces():
            return []
        out = self._run("netns", "pids", name, check=False)
        return [int(tok) for tok in out.stdout.split() if tok.isdigit()]


__all__ = ["NETNS_ETC", "IpRoute2", "NetworkLayer"]
