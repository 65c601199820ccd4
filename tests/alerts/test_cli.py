"""`stormwatch alerts` commands, run as the console script."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from stormwatch.alerts import rules_dir


def _run(
    kit: Any, *args: str, check: bool = True, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [kit.stormwatch, *args], capture_output=True, text=True, timeout=300, check=check, env=env
    )


def test_rules_path_prints_the_folder_of_the_shipped_rules(kit: Any) -> None:
    path = Path(_run(kit, "alerts", "rules-path").stdout.strip())
    assert path == rules_dir()
    assert (path / "ranks.yml").is_file()


def test_check_runs_promtool_check_and_test(kit: Any) -> None:
    """Also the one run of the shipped rules' whole promtool unit-test pack in the suite
    (``alerts/rules/tests``: minutes of CPU); ``test_rules.py`` runs single cases."""
    out = _run(kit, "alerts", "check", check=False)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "promtool check rules" in out.stdout
    assert "promtool test rules" in out.stdout
    assert (
        "ok: rules agent.yml, gpu.yml, network.yml, nodes.yml, ranks.yml, targets.yml, "
        "training.yml" in out.stdout
    )


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


def test_incidents_without_a_lab_says_what_to_give_instead(kit: Any, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STORMWATCH_")}
    out = subprocess.run(
        [kit.stormwatch, "alerts", "incidents"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "no local lab is up in run" in out.stderr, out.stderr
    assert "--db" in out.stderr and "Traceback" not in out.stderr
    approve = subprocess.run(
        [kit.stormwatch, "alerts", "approve", "1"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert approve.returncode == 2 and "no local lab is up" in approve.stderr, approve.stderr
    assert "--db" not in approve.stderr  # approving needs the live responder


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
        assert "run/demo/responder/responder.sqlite after `make demo`" in out.stderr
        assert "Traceback" not in out.stderr


def _responder_db(kit: Any, path: Path) -> Path:
    """A responder database as `alerts serve` leaves it: two incidents, one action finished
    with a long detail (real Store, real webhook payloads)."""
    from stormwatch.alerts.responder.payload import WebhookMessage
    from stormwatch.alerts.responder.store import Store

    store = Store(path)
    t = time.time() - 300
    for job, ranks in (("train", ("3", "0")), ("pretrain-llama-70b-with-a-long-name", ("12",))):
        alerts = [
            kit.alert(starts_at=t, rank=r, job=job, fingerprint=kit.fingerprint()) for r in ranks
        ]
        message = WebhookMessage.model_validate(kit.payload(*alerts, group_key=f"{{}}:{job}"))
        store.ingest(message, received_at=t, actions_for=lambda _name: ["confirm_restart"])
    assert store.claim_action(1, now=t)
    store.finish_action(
        1,
        status="failed",
        detail="no restart seen within 300 s: the job's ranks still report the old "
        "stormwatch_trainer_restarts_total value on every node of the job",
        data={},
        now=t + 300,
    )
    store.close()
    return path


def test_incidents_reads_the_responder_database_offline(kit: Any, tmp_path: Path) -> None:
    db = _responder_db(kit, tmp_path / "responder.sqlite")
    data = json.loads(_run(kit, "alerts", "incidents", "--db", str(db), "--json").stdout)
    assert [i["labels"]["training_job"] for i in data["incidents"]] == [
        "train",
        "pretrain-llama-70b-with-a-long-name",
    ]
    assert [a["status"] for a in data["actions"]] == ["failed", "pending"]
    wide = _run(kit, "alerts", "incidents", "--db", str(db), columns=400).stdout
    assert f"Incidents in {db}" in wide
    assert "pretrain-llama-70b-with-a-long-name" in wide and "every node of the job)" in wide
    both = _run(kit, "alerts", "incidents", "--db", str(db), "--url", "http://x:1", check=False)
    assert both.returncode == 2 and "give either --db or --url/--token-file" in both.stderr


def _table_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│")]


def test_incidents_table_keeps_one_line_per_incident_at_80_columns(
    kit: Any, tmp_path: Path
) -> None:
    db = _responder_db(kit, tmp_path / "responder.sqlite")
    out = _run(kit, "alerts", "incidents", "--db", str(db), columns=80).stdout
    assert all(len(line) <= 80 for line in out.splitlines()), out
    first, second = _table_rows(out)  # one line each, the long detail cut short
    cells = [cell.strip() for cell in first.split("│")[1:-1]]
    assert cells[:5] == ["1", "open", "RankStalled", "0 (tied)", "2"]  # id .. rank, alerts
    assert cells[5] == "5m" and cells[6].startswith("confirm_restart: f") and "…" in cells[6]
    assert [cell.strip() for cell in second.split("│")[1:5]] == ["2", "open", "RankStalled", "12"]
    wide = _run(kit, "alerts", "incidents", "--db", str(db), columns=400).stdout
    assert len(_table_rows(wide)) == 2 and "…" not in wide


def test_incidents_db_that_is_not_a_responder_database_is_named_with_the_fix(
    kit: Any, tmp_path: Path
) -> None:
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE notes (text TEXT)").connection.close()
    before = other.read_bytes()
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    cases = (
        (tmp_path / "none.sqlite", "does not exist"),
        (tmp_path, "is a folder"),
        (text, "is not a SQLite database"),
        (other, "is a SQLite database without the responder's tables"),
    )
    for db, said in cases:
        out = _run(kit, "alerts", "incidents", "--db", str(db), check=False)
        assert out.returncode == 2, out.stderr
        assert f"--db: {db}: {said}" in out.stderr and "alerts serve --db FILE" in out.stderr
        assert "Traceback" not in out.stderr
    assert other.read_bytes() == before  # read-only: another program's file is left alone


def test_postmortem_with_a_file_that_is_not_a_database_exits_2(kit: Any, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    out = _run(kit, "alerts", "postmortem", "1", "--db", str(text), check=False)
    assert out.returncode == 2, out.stderr
    assert f"--db: {text}: is not a SQLite database" in out.stderr
    assert "Traceback" not in out.stderr and text.read_text() == "not a database\n"


def test_a_url_that_does_not_parse_is_named_with_exit_2(kit: Any, tmp_path: Path) -> None:
    """urlsplit raises ValueError for a broken IPv6 literal: a clear error, no traceback."""
    token = tmp_path / "token"
    token.write_text("t\n")
    runs = {
        "url": _run(kit, "alerts", "incidents", "--url", "http://[::1", "--token-file", str(token),
                    check=False),
        "responder_url": _run(kit, "alerts", "config", "alertmanager", "--responder-url",
                              "http://[::1", "--token-file", str(token), check=False),
    }  # fmt: skip
    for field, out in runs.items():
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert f"{field}: 'http://[::1' is not an http(s) URL" in out.stderr


def test_settings_files_that_are_not_utf8_are_named_with_exit_2(kit: Any, tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x89\xd7\x00binary")
    token = tmp_path / "token"
    token.write_text("t\n")
    serve = ("alerts", "serve", "--db", str(tmp_path / "r.sqlite"), "--token-file", str(token),
             "--listen", "127.0.0.1:0")  # fmt: skip
    runs = {
        "POLICY_FILE": _run(kit, "alerts", "policy-check", str(binary), check=False),
        "--policy": _run(kit, *serve, "--policy", str(binary), check=False),
        "--platform-config": _run(kit, *serve, "--platform", "slurm", "--platform-config",
                                  str(binary), check=False),
    }  # fmt: skip
    for flag, out in runs.items():
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert f"{flag}: {binary} is not UTF-8 text" in out.stderr


def test_config_alertmanager_to_an_unwritable_output_exits_2_and_leaves_nothing(
    kit: Any, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    for output in (folder, tmp_path / "missing" / "alertmanager.yml"):
        out = _run(kit, "alerts", "config", "alertmanager", "--responder-url",
                   "http://127.0.0.1:19095", "--token-file", str(token), "-o", str(output),
                   check=False)  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert f"--output: cannot write {output}" in out.stderr
    assert list(folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "token"]
