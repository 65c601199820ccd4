"""Item 9: TLS and basic auth from a Prometheus web-config file; the fault API on its own listener.

The certificate is a real self-signed one (``cryptography``), the server the real
agent, and the scraper a real Prometheus binary speaking TLS with basic auth.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from stormwatch.agent import AgentConfigError
from stormwatch.agent.cli import agent as agent_cli
from stormwatch.agent.errors import WebConfigError
from stormwatch.agent.webconfig import load_web_config

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

USER, PASSWORD = "prometheus", "s3cret-scrape"


@pytest.fixture(scope="module")
def cert(tls_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost and its key (PEM files)."""
    return tls_pair


@pytest.fixture(scope="module")
def password_hash() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def web_config(tmp_path: Path, cert: tuple[Path, Path], password_hash: str) -> Path:
    """TLS with the test certificate (relative paths, as upstream allows) and one user."""
    for source, name in zip(cert, ("agent.crt", "agent.key"), strict=True):
        shutil.copy(source, tmp_path / name)
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n"
        "  cert_file: agent.crt\n"
        "  key_file: agent.key\n"
        "  min_version: TLS12\n"
        "http_server_config:\n"
        "  headers: {X-Content-Type-Options: nosniff}\n"
        "basic_auth_users:\n"
        f"  {USER}: '{password_hash}'\n"
    )
    return path


def _https(
    url: str,
    cert: Path,
    *,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {pair}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(cert))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read()


# ------------------------------------------------------------ TLS + basic auth
def test_metrics_over_tls_need_the_right_password(
    start_agent: Any, web_config: Path, cert: tuple[Path, Path]
) -> None:
    agent = start_agent(web_config_file=web_config)
    assert agent.url.startswith("https://")
    status, headers, body = _https(agent.url + "/metrics", cert[0], user=USER, password=PASSWORD)
    assert status == 200 and b"DCGM_FI_DEV_GPU_TEMP" in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    for user, password in ((USER, "wrong"), ("nobody", PASSWORD), (None, None)):
        status, headers, _ = _https(agent.url + "/healthz", cert[0], user=user, password=password)
        assert status == 401, (user, password)
        assert headers["WWW-Authenticate"].startswith("Basic")


def test_plain_http_to_the_tls_listener_gets_no_metrics(
    start_agent: Any, web_config: Path, tools: Any
) -> None:
    agent = start_agent(web_config_file=web_config)
    plain = agent.url.replace("https://", "http://")
    with pytest.raises((OSError, ConnectionError)):
        tools.http("GET", plain + "/metrics")


def test_fault_api_uses_tls_and_the_token_not_basic_auth(
    start_agent: Any, web_config: Path, cert: tuple[Path, Path], tools: Any
) -> None:
    agent = start_agent(web_config_file=web_config)
    assert agent.fault_url.startswith("https://")
    status, _, body = _https(agent.fault_url + "/v1/faults", cert[0], token=tools.token)
    assert status == 200 and json.loads(body) == {"faults": []}
    status, headers, _ = _https(
        agent.fault_url + "/v1/faults", cert[0], user=USER, password=PASSWORD
    )
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.e2e
def test_prometheus_scrapes_the_agent_over_tls_with_basic_auth(
    start_agent: Any, web_config: Path, cert: tuple[Path, Path], tmp_path: Path, tools: Any
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt install prometheus; `make setup` does it)")
    agent = start_agent(web_config_file=web_config, sample_interval=1.0)
    target = agent.url.removeprefix("https://")

    def job(name: str, password: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": "https",
            "tls_config": {"ca_file": str(cert[0])},
            "basic_auth": {"username": USER, "password": password},
            "static_configs": [{"targets": [target]}],
        }

    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [job("right", PASSWORD), job("wrong", "not-it")],
            }
        )
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "prometheus.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=sink,
            stderr=sink,
        )
    try:

        def targets() -> dict[str, dict[str, Any]] | None:
            url = f"http://127.0.0.1:{port}/api/v1/targets"
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    active = json.loads(reply.read())["data"]["activeTargets"]
            except OSError:
                return None
            found = {t["labels"]["job"]: t for t in active}
            done = all(t.get("health") in ("up", "down") for t in found.values())
            return found if len(found) == 2 and done else None

        found = tools.wait_for(targets, timeout=60, interval=0.5)
        assert found["right"]["health"] == "up", found["right"].get("lastError")
        assert found["wrong"]["health"] == "down"
        assert "401" in found["wrong"]["lastError"]
        query = urllib.parse.urlencode({"query": 'DCGM_FI_DEV_GPU_TEMP{job="right"}'})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}") as reply:
            assert len(json.loads(reply.read())["data"]["result"]) == 2, "both GPUs stored"
    finally:
        proc.terminate()
        proc.wait(30)


# --------------------------------------------------------- web-config errors
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("tls_server_config: {cert_file: a.crt}\n", "tls_server_config.key_file: required"),
        (
            "tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n",
            "tls_server_config.cert_file: no file",
        ),
        ("basic_auth_users: {prometheus: plaintext}\n", "expected a bcrypt hash"),
        ("tls_config: {}\n", "tls_config: unknown key"),
        (
            "tls_server_config: {cert_file: a, key_file: b, min_version: TLS14}\n",
            "tls_server_config.min_version",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequestClientCert}\n",
            "client_auth_type",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, cipher_suites: [X]}\n",
            "cipher_suites is not supported",
        ),
        ("- just\n- a list\n", "expected a mapping"),
        ("key: [unclosed\n", "invalid YAML"),
        (  # YAML keeps the last of two equal keys silently: the second password won unseen
            "basic_auth_users:\n  prometheus: $2b$12$x\n  prometheus: $2b$12$y\n",
            "invalid YAML: duplicate key 'prometheus' at line 3, column 3",
        ),
        ("tls_server_config: {cert_file: g.crt, key_file: g.key}\n", "not a PEM certificate"),
        (
            "tls_server_config: {cert_file: g.crt, key_file: g.key, min_version: TLS13, "
            "max_version: TLS12}\n",
            "min_version TLS13 is above max_version",
        ),
    ],
)
def test_a_bad_web_config_names_the_key_and_the_fix(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    for garbage in ("g.crt", "g.key"):
        (tmp_path / garbage).write_text("not PEM\n")
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert str(caught.value).startswith(f"web config {path}: "), "every error names the file"
    assert named in str(caught.value)
    assert isinstance(caught.value, AgentConfigError)


def test_a_key_that_does_not_match_the_certificate_is_refused(
    tmp_path: Path, cert: tuple[Path, Path]
) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    wrong_key = tmp_path / "other.key"
    wrong_key.write_bytes(
        other.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config: {{cert_file: {cert[0]}, key_file: {wrong_key}}}\n")
    with pytest.raises(WebConfigError, match="not a PEM certificate and its private key"):
        load_web_config(path)


def test_agent_run_with_a_bad_web_config_prints_one_error_and_no_traceback(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: {prometheus: hunter2}\n")
    (tmp_path / "metrics").mkdir()
    stormwatch = Path(sys.executable).with_name("stormwatch")
    done = subprocess.run(
        [
            str(stormwatch),
            "agent",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--metrics-dir",
            str(tmp_path / "metrics"),
            "--state-dir",
            str(tmp_path / "state"),
            "--gpu-backend",
            "sim",
            "--web-config-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "basic_auth_users" in done.stderr and "bcrypt hash" in done.stderr
    assert done.stderr.strip().count("\n") <= 1, done.stderr


def test_fault_api_listen_must_be_host_and_port(tmp_path: Path) -> None:
    stormwatch = Path(sys.executable).with_name("stormwatch")
    done = subprocess.run(
        [
            str(stormwatch),
            "agent",
            "run",
            "--metrics-dir",
            str(tmp_path),
            "--fault-api-listen",
            "9401",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "fault_listen (--fault-api-listen): expected HOST:PORT" in done.stderr


def test_token_file_without_the_fault_api_is_a_usage_error(tmp_path: Path) -> None:
    token = tmp_path / "agent.token"
    token.write_text("s3cret\n")
    stormwatch = Path(sys.executable).with_name("stormwatch")
    done = subprocess.run(
        [
            str(stormwatch),
            "agent",
            "run",
            "--metrics-dir",
            str(tmp_path),
            "--token-file",
            str(token),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--token-file is only used by the fault API" in done.stderr
    assert "add --fault-api-listen HOST:PORT" in done.stderr and "drop --token-file" in done.stderr


# ------------------------------------------------------------ the README's commands
README = Path(__file__).resolve().parents[2] / "README.md"


def _securing_section_commands() -> list[str]:
    """The shell lines of the README's "Securing the node agent" console blocks (a line
    continued with a backslash joined to the next)."""
    section = README.read_text().split("### Securing the node agent", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```console\n")[1:]]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_commands_for_securing_the_agent_run_as_written(
    tmp_path: Path, cert: tuple[Path, Path], password_hash: str
) -> None:
    """Run as written, except that /etc and /run are folders under tmp_path and both
    listeners are on 127.0.0.1 (any free port)."""
    commands = _securing_section_commands()
    [agent_line] = [c for c in commands if c.startswith("stormwatch agent run ")]
    required = [o for p in agent_cli.commands["run"].params if p.required for o in p.opts]
    assert required and all(option in agent_line.split() for option in required), agent_line
    etc = tmp_path / "etc" / "stormwatch"
    etc.mkdir(parents=True)
    for source, name in zip(cert, ("agent.crt", "agent.key"), strict=True):
        shutil.copy(source, etc / name)
    (etc / "web.yml").write_text(
        "tls_server_config: {cert_file: agent.crt, key_file: agent.key}\n"
        f"basic_auth_users:\n  {USER}: '{password_hash}'\n"
    )
    here = {"/etc/stormwatch": str(etc), "/run/stormwatch": str(tmp_path / "run" / "stormwatch")}
    here |= {"0.0.0.0:9400": "127.0.0.1:0", "0.0.0.0:9401": "127.0.0.1:0"}
    script = []
    for command in commands:
        for written, local in here.items():
            command = command.replace(written, local)
        # exec: the agent is bash's process, so terminate() below stops it.
        script.append(("exec " if command.startswith("stormwatch agent run") else "") + command)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    log = tmp_path / "agent.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            ["bash", "-euc", "\n".join(script)], stdout=sink, stderr=sink, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on https://" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "fault API on https://" in log.read_text()
        assert (etc / "agent.token").read_text().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
