"""A lab's names belong to one run directory: ``lab down`` elsewhere never touches it.

These tests build no lab: a registry entry, a ``lab.json`` and one namespace with
one marked process stand in for "a lab with this prefix is up in run dir A".
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormwatch.lab import Lab, LabConfig, LabOwnedElsewhereError, registry
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import procs
from stormwatch.lab.state import ProcessRecord, StateStore, plan_state

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.REGISTRY_ENV, str(tmp_path / "registry"))


def _lab_up_in(run_dir: Path, config: LabConfig) -> None:
    """A ``lab.json`` saying "up" and the registry's claim, as ``lab up`` leaves them."""
    paths = RunPaths.of(run_dir)
    state = plan_state(paths, config)
    state.phase = "up"
    StateStore(paths).save(state)
    registry.claim(config.prefix, paths.run_dir)


@pytest.fixture
def other_lab_namespace(tmp_path: Path, lab_config: LabConfig) -> Iterator[ProcessRecord]:
    """Namespace ``<prefix>-node0`` with a process of the lab in ``tmp_path/a``."""
    network = IpRoute2()
    netns = lab_config.netns(0)
    network.add_namespace(netns, {})
    owner = RunPaths.of(tmp_path / "a").run_dir
    record = procs.launch(
        "agent-node0",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        log_file=tmp_path / "agent.log",
        status_file=tmp_path / "agent.status",
        env={procs.LAB_MARKER_ENV: str(owner), "PATH": "/usr/bin:/bin"},
        netns=netns,
    )
    try:
        yield record
    finally:
        procs.terminate(procs.tree(record))
        network.delete_namespace(netns)


def test_down_with_a_mistyped_run_dir_refuses_and_names_the_owner(
    tmp_path: Path, lab_config: LabConfig
) -> None:
    owner = tmp_path / "a"
    _lab_up_in(owner, lab_config)
    typo = tmp_path / "typo"
    typo.mkdir()
    with pytest.raises(LabOwnedElsewhereError) as caught:
        Lab(typo).down(lab_config)
    message = str(caught.value)
    assert str(owner) in message and f"lab down --run-dir {owner}" in message
    assert registry.owner(lab_config.prefix) is not None
    assert StateStore(RunPaths.of(owner)).require().phase == "up"


def test_a_stale_claim_does_not_block_down(tmp_path: Path, lab_config: LabConfig) -> None:
    registry.claim(lab_config.prefix, tmp_path / "gone")  # no lab.json there
    assert Lab(tmp_path / "here").down(lab_config) == []


def test_down_without_registry_spares_another_labs_namespace_and_processes(
    tmp_path: Path, lab_config: LabConfig, other_lab_namespace: ProcessRecord
) -> None:
    here = tmp_path / "typo"
    # No lab.json here: refused, because a process of lab "a" lives in the namespace.
    with pytest.raises(LabOwnedElsewhereError, match=str(tmp_path / "a")):
        Lab(here).down(lab_config)
    # A lab.json here (brought down earlier): the name sweep still spares lab "a".
    paths = RunPaths.of(here)
    state = plan_state(paths, lab_config)
    state.phase = "down"
    StateStore(paths).save(state)
    Lab(here).down(lab_config)
    assert procs.is_running(other_lab_namespace)
    assert lab_config.netns(0) in IpRoute2().namespaces()
