"""The responder annotates Grafana: incidents opened and closed, actions run.

A real responder process (``start_responder``) configured by ``STORMWATCH_GRAFANA_URL``
and ``GRAFANA_TOKEN``, against the stand-in Grafana of tests/conftest.py
(``grafana``) or one that never answers (``silent_grafana``).
"""

from __future__ import annotations

import os
import time
from typing import Any

TOKEN = "glsa_test-token"  # the stand-in's (tests/conftest.py GRAFANA_TEST_TOKEN)


def _configure(url: str) -> None:
    os.environ["STORMWATCH_GRAFANA_URL"] = url  # restored by tests/conftest.py
    os.environ["GRAFANA_TOKEN"] = TOKEN


def test_incident_open_close_and_action_are_annotated(
    grafana: Any, start_responder: Any, kit: Any
) -> None:
    _configure(grafana.url)
    responder = start_responder()
    starts_at = time.time() - 10
    fp = kit.fingerprint()
    assert responder.post(kit.payload(kit.alert(starts_at=starts_at, fingerprint=fp))).status == 200
    [incident] = responder.get("incidents")
    [action] = kit.wait_for(
        lambda: [a for a in responder.get("actions") if a["status"] == "skipped"], 10, "skip"
    )
    resolved = kit.alert(
        status="resolved", starts_at=starts_at, ends_at=time.time(), fingerprint=fp
    )
    assert responder.post(kit.payload(resolved)).status == 200

    kit.wait_for(lambda: len(grafana.annotations) >= 3, 10, "three annotations")
    [opened] = grafana.texts("incident-opened")
    [closed] = grafana.texts("incident-closed")
    [ran] = grafana.texts("action-skipped")
    assert opened.startswith(f"incident {incident['id']} opened: StormwatchRankStalled")
    assert closed.startswith(f"incident {incident['id']} closed: StormwatchRankStalled")
    assert ran.startswith(f"action {action['id']} ({action['kind']}) for incident {incident['id']}")
    for note in grafana.annotations:
        assert note["tags"][0] == "stormwatch" and note["time"] <= note["timeEnd"]
    assert len(grafana.annotations) == 3


def test_silent_grafana_does_not_delay_the_responder(
    silent_grafana: str, start_responder: Any, kit: Any
) -> None:
    _configure(silent_grafana)
    responder = start_responder()
    for _ in range(3):
        began = time.monotonic()
        reply = responder.post(
            kit.payload(kit.alert(starts_at=time.time(), fingerprint=kit.fingerprint()))
        )
        assert reply.status == 200
        assert time.monotonic() - began < 1.0  # the default annotation timeout is 2 s
    began = time.monotonic()
    assert responder.stop() == 0
    assert time.monotonic() - began < 2.0 + 3.0  # shutdown waits at most the timeout for Grafana
