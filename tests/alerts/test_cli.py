"""`stormwatch alerts` commands, run as the console script."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from stormwatch.alerts import rules_dir


def _run(kit: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [kit.stormwatch, *args], capture_output=True, text=True, timeout=120, check=check, env=env
    )


def test_rules_path_prints_the_folder_of_the_shipped_rules(kit: Any) -> None:
    path = Path(_run(kit, "alerts", "rules-path").stdout.strip())
    assert path == rules_dir()
    assert (path / "ranks.yml").is_file()


def test_check_runs_promtool_check_and_test(kit: Any) -> None:
    out = _run(kit, "alerts", "check")
    assert "promtool check rules" in out.stdout
    assert "promtool test rules" in out.stdout
    assert "ok: rules gpu.yml, nodes.yml, ranks.yml, training.yml" in out.stdout


def test_incidents_lists_incidents_with_their_actions(kit: Any, start_responder: Any) -> None:
    responder = start_responder()
    t = time.time()
    responder.post(
        kit.payload(
            kit.alert(starts_at=t, rank="3", fingerprint=kit.fingerprint()),
            kit.alert(starts_at=t + 1, rank="0", fingerprint=kit.fingerprint()),
        )
    )
    kit.wait_for(lambda: responder.get("actions")[0]["status"] == "skipped", 10, "skip")
    table = _run(
        kit,
        "alerts",
        "incidents",
        "--url",
        responder.url,
        "--token-file",
        str(responder.token_file),
    ).stdout
    assert "StormwatchRankStalled" in table
    assert "open" in table and "confirm_restart: skipped" in table
    [row] = [line for line in table.splitlines() if "StormwatchRankStalled" in line]
    assert [cell.strip() for cell in row.split("│")[5:7]] == ["3", "2"]  # first rank, alerts
    data = json.loads(
        _run(
            kit,
            "alerts",
            "incidents",
            "--url",
            responder.url,
            "--token-file",
            str(responder.token_file),
            "--json",
        ).stdout
    )
    assert data["incidents"][0]["first_alert"]["labels"]["rank"] == "3"
    assert len(data["incidents"][0]["members"]) == 2
    assert data["actions"][0]["kind"] == "confirm_restart"


def test_incidents_with_a_wrong_token_fails_cleanly(
    kit: Any, start_responder: Any, tmp_path: Path
) -> None:
    responder = start_responder()
    wrong = tmp_path / "wrong.token"
    wrong.write_text("nope\n")
    out = _run(
        kit, "alerts", "incidents", "--url", responder.url, "--token-file", str(wrong), check=False
    )
    assert out.returncode == 1
    assert "HTTP 401" in out.stderr and "Traceback" not in out.stderr


def test_serve_rejects_a_bad_listen_address(kit: Any, tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("abc\n")
    out = _run(
        kit,
        "alerts",
        "serve",
        "--listen",
        "nowhere",
        "--db",
        str(tmp_path / "db"),
        "--token-file",
        str(token),
        check=False,
    )
    assert out.returncode == 2
    assert "--listen" in out.stderr and "Traceback" not in out.stderr


def test_serve_on_a_busy_port_fails_cleanly(kit: Any, start_responder: Any, tmp_path: Path) -> None:
    responder = start_responder()
    port = responder.url.rsplit(":", 1)[1]
    out = _run(
        kit,
        "alerts",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--db",
        str(tmp_path / "other.sqlite"),
        "--token-file",
        str(responder.token_file),
        check=False,
    )
    assert out.returncode == 2
    assert "cannot listen" in out.stderr and "Traceback" not in out.stderr


def test_postmortem_names_a_missing_or_folder_db_and_how_to_fix_it(
    kit: Any, tmp_path: Path
) -> None:
    for db, said in ((tmp_path / "none.db", "does not exist"), (tmp_path, "is a folder")):
        out = _run(kit, "alerts", "postmortem", "1", "--db", str(db), check=False)
        assert out.returncode == 2, out.stderr
        assert f"--db: {db} {said}" in out.stderr and "alerts serve --db" in out.stderr
        assert "Traceback" not in out.stderr
