"""A two-node network for fault tests: namespaces A and B on a bridge, a real agent in A.

Like the lab (``lab``): each node is a network namespace with ``eth0`` on
a bridge in the root namespace, whose address the test (the "controller")
uses to reach the agent's fault API; the agent runs *inside* A, so the
iptables/tc state it changes is A's. B runs :mod:`netprobe` listeners.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

STORMWATCH = Path(sys.executable).with_name("stormwatch")
NETPROBE = Path(__file__).with_name("netprobe.py")
TOKEN = "fault-test-token-0123456789"
AGENT_PORT, FAULT_PORT = 9400, 9401
#: B's TCP listeners (7000: "the peer", 7001: another service), A's UDP echo.
TCP_PORTS, UDP_PORT = (7000, 7001), 7100


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=60)


class FaultNet:
    """Namespaces ``<prefix>a`` / ``<prefix>b``, bridge ``<prefix>br``, agent in A."""

    _made = 0  # several per test process: each gets its own names (netns deletion is lazy)

    def __init__(self, base: Path) -> None:
        tag = os.getpid() % 250
        FaultNet._made += 1
        self.prefix = f"swf{tag}{'abcdefghijklmnopqrstuvwxyz'[FaultNet._made % 26]}"
        self.ns_a, self.ns_b, self.bridge = f"{self.prefix}a", f"{self.prefix}b", f"{self.prefix}br"
        self.net = f"10.251.{tag}"
        self.addr_a, self.addr_b, self.gateway = f"{self.net}.1", f"{self.net}.2", f"{self.net}.254"
        self.base = base
        self.token_file = base / "agent.token"
        self.state_dir = base / "agent-state"
        self.metrics_dir = base / "metrics"
        self.agent: subprocess.Popen[str] | None = None
        self._helpers: list[subprocess.Popen[str]] = []

    # ------------------------------------------------------------- set-up
    def up(self) -> FaultNet:
        self.down_network()
        self.base.mkdir(parents=True, exist_ok=True)
        self.metrics_dir.mkdir(exist_ok=True)
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for ns, address, side in ((self.ns_a, self.addr_a, "a"), (self.ns_b, self.addr_b, "b")):
            veth = f"{self.prefix}v{side}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge, "up")
            self.ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            self.ns(ns, "ip", "link", "set", "eth0", "up")
            self.ns(ns, "ip", "link", "set", "lo", "up")
            self.ns(ns, "ip", "route", "add", "default", "via", self.gateway)
        self._spawn(self.ns_b, "serve", *map(str, TCP_PORTS))
        self._spawn(self.ns_a, "udp-echo", str(UDP_PORT))
        self.start_agent()
        return self

    def _spawn(self, ns: str, *probe: str) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(NETPROBE), *probe],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        self._helpers.append(proc)

    def start_agent(self) -> None:
        log = (self.base / "agent.log").open("a")
        self.agent = subprocess.Popen(
            [
                "ip", "netns", "exec", self.ns_a, str(STORMWATCH), "agent", "run",
                "--listen", f"{self.addr_a}:{AGENT_PORT}",
                "--fault-api-listen", f"{self.addr_a}:{FAULT_PORT}",
                "--node", "fa", "--metrics-dir", str(self.metrics_dir), "--gpu-backend", "sim",
                "--sample-interval", "0.2", "--token-file", str(self.token_file),
                "--state-dir", str(self.state_dir), "--no-claim-unlabelled-ranks",
            ],
            stdout=log,
            stderr=log,
            text=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while self.request("GET", f"{self.agent_url}/healthz")[0] != 200:
            assert self.agent.poll() is None, (self.base / "agent.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "agent did not start"
            time.sleep(0.1)

    def kill_agent(self) -> None:
        """SIGKILL the agent (no clean shutdown: its faults stay applied)."""
        assert self.agent is not None
        for child in _children(self.agent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        self.agent.kill()
        self.agent.wait(10)

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)  # ip netns exec execs: the agent gets it
            try:
                self.agent.wait(20)
            except subprocess.TimeoutExpired:
                self.kill_agent()

    def down(self) -> None:
        self.stop_agent()
        for proc in self._helpers:
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        self.down_network()

    def down_network(self) -> None:
        for side in "ab":  # deleting the outer end removes the pair at once
            sh("ip", "link", "del", f"{self.prefix}v{side}", check=False)
        for ns in (self.ns_a, self.ns_b):
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    # -------------------------------------------------------------- probes
    @property
    def agent_url(self) -> str:
        return f"http://{self.addr_a}:{AGENT_PORT}"

    @property
    def fault_url(self) -> str:
        return f"http://{self.addr_a}:{FAULT_PORT}"

    def ns(self, ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", ns, *cmd, check=check)

    def probe(self, ns: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.ns(ns, sys.executable, str(NETPROBE), *args, check=False)

    def a_connects(self, host: str, port: int, timeout: float = 0.5) -> bool:
        return self.probe(self.ns_a, "connect", host, str(port), str(timeout)).returncode == 0

    def rules(self) -> list[str]:
        """A's iptables rules and chains that a fault added (``SWI-``/``SWO-``)."""
        out = self.ns(self.ns_a, "iptables", "-w", "-S").stdout.splitlines()
        return [line for line in out if "SWI-" in line or "SWO-" in line]

    def qdisc(self) -> str:
        return self.ns(self.ns_a, "tc", "qdisc", "show", "dev", "eth0").stdout

    def link_up(self) -> bool:
        shown = json.loads(self.ns(self.ns_a, "ip", "-j", "link", "show", "dev", "eth0").stdout)
        return "UP" in shown[0]["flags"]

    def default_route(self) -> bool:
        return "default" in self.ns(self.ns_a, "ip", "route", "show").stdout

    # ----------------------------------------------------------- fault API
    def request(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {TOKEN}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=15) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read() or b"null")
        except OSError:
            return 0, None

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every sample ``name`` on the agent's ``/metrics``."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.agent_url}/metrics", timeout=15) as reply:
            text = reply.read().decode()
        return [
            (dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        ]

    def inject(self, body: dict[str, Any]) -> dict[str, Any]:
        status, answer = self.request("POST", f"{self.fault_url}/v1/faults", body)
        assert status in (200, 201), (status, answer)
        return dict(answer)

    def revert(self, fault_id: str) -> tuple[int, Any]:
        """``DELETE``, retried for 10 s while the agent cannot be reached (a lossy link)."""
        deadline = time.monotonic() + 10
        while True:
            status, answer = self.request("DELETE", f"{self.fault_url}/v1/faults/{fault_id}")
            if status != 0 or time.monotonic() > deadline:
                return status, answer
            time.sleep(0.2)

    def record(self, fault_id: str) -> dict[str, Any]:
        status, answer = self.request("GET", f"{self.fault_url}/v1/faults/{fault_id}")
        assert status == 200, (status, answer)
        return dict(answer)


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []
