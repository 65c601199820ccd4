"""A controller waits for the responder's post-mortem of each incident its experiment closed.

`make demo` (found 2026-12-05): the kill-rank incident closed ~0.7 s before the demo brought
the lab down; the responder writes its post-mortem 2 s after a close and takes ~4 s, so
`lab down` stopped it first, and the demo printed no incident post-mortem and said nothing.
Here a real responder closes an incident during the wait
(:mod:`stormwatch.chaos.reports.incidents`), which returns only once the report is on disk.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stormwatch.chaos.reports.incidents import incident_postmortems
from stormwatch.clients.responder import ResponderClient


@dataclass
class Said:
    """A reporter that keeps what it was told."""

    events: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def event(self, text: str) -> None:
        self.events.append(text)


def test_the_wait_returns_the_responders_report_of_the_closed_incident(
    tmp_path: Path, kit: Any
) -> None:
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "responder.token"
    token_file.write_text(token + "\n")
    folder = tmp_path / "postmortems"
    responder = kit.responder_process(
        db=tmp_path / "responder.sqlite",
        token=token,
        token_file=token_file,
        log=tmp_path / "responder.log",
        args=("--postmortem-dir", str(folder)),
    ).start()
    try:
        since = time.time()
        t0 = since - 30  # the alert's own start (Prometheus's), before the experiment's
        firing = kit.alert(alertname="DemoWaitAlert", starts_at=t0)
        resolved = kit.alert(alertname="DemoWaitAlert", status="resolved", starts_at=t0,
                             ends_at=t0 + 20)  # fmt: skip
        assert responder.post(kit.payload(firing)).status == 200
        client = ResponderClient(responder.url, token_file=token_file)
        page = folder / "incident-1" / "postmortem.html"

        def wait(**kw: Any) -> tuple[list[Path], Said]:
            said = Said()
            found = asyncio.run(
                incident_postmortems(client, folder=folder, reporter=said, **{"since": since, **kw})
            )
            return found, said

        # Open, and not one the caller waits for: nothing to wait for.
        nothing = Said(events=["  the responder closed no incident during the experiment"])
        assert wait(timeout=30) == ([], nothing)
        # Open, and the caller's alert: waited for to close (here: not within 0 s).
        found, said = wait(closing=lambda i: i.alertname == "DemoWaitAlert", timeout=0)
        assert found == [] and said.events == ["  incident 1 did not close within 0 s"]

        # Closed 1 s into the wait, then its report written after the responder's settle.
        closer = threading.Timer(1.0, lambda: responder.post(kit.payload(resolved)))
        closer.start()
        started = time.monotonic()
        try:
            found, said = wait(closing=lambda i: i.alertname == "DemoWaitAlert")
        finally:
            closer.join()
        assert found == [page] and page.exists(), said.events
        assert (folder / "incident-1" / "postmortem.md").exists()
        assert time.monotonic() - started > 1.5  # the close, then the responder's settle
        assert said.events == []
        assert said.statuses[0] == "waiting for the responder: incident 1 to close"
        assert said.statuses[-1] == "waiting for the responder: the post-mortem of incident 1"

        # Closed and written: found at once; an incident opened before `since` is not looked at.
        assert wait(timeout=0) == ([page], Said())
        assert wait(since=time.time() + 60) == ([], nothing)
    finally:
        responder.stop()


def test_an_unreachable_responder_is_asked_until_the_timeout_then_said_not_raised(
    tmp_path: Path, kit: Any
) -> None:
    said = Said()
    client = ResponderClient(f"http://127.0.0.1:{kit.free_port()}", token="t", timeout=2.0)
    started = time.monotonic()
    found = asyncio.run(
        incident_postmortems(client, since=0.0, folder=tmp_path, reporter=said, timeout=1.5)
    )
    assert found == [] and 1.5 <= time.monotonic() - started < 10
    [event] = said.events
    assert event.startswith("  the responder's incident post-mortems: cannot list incidents: ")
    assert event.endswith(" (for 1.5 s)") and len(said.statuses) >= 2, said


def test_a_refusal_ends_the_wait_at_once(tmp_path: Path, kit: Any) -> None:
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "responder.token"
    token_file.write_text(token + "\n")
    responder = kit.responder_process(
        db=tmp_path / "responder.sqlite", token=token, token_file=token_file,
        log=tmp_path / "responder.log", args=("--no-postmortems",),
    ).start()  # fmt: skip
    try:
        said = Said()
        wrong = ResponderClient(responder.url, token="not-the-token")
        started = time.monotonic()
        found = asyncio.run(
            incident_postmortems(wrong, since=0.0, folder=tmp_path, reporter=said, timeout=30)
        )
        assert found == [] and time.monotonic() - started < 5  # a 401 is not asked again
        [event] = said.events
        assert "cannot list incidents" in event and "401" in event, event
    finally:
        responder.stop()
