"""A lab's names belong to one run directory: ``lab down`` elsewhere never touches it.

These tests build no lab: a registry entry, a ``lab.json`` and one namespace with
one marked process stand in for "a lab with this prefix is up in run dir A".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stormwatch.lab import Lab, LabConfig, LabOwnedElsewhereError, registry
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import procs
from stormwatch.lab.state import ProcessRecord, StateStore, plan_state

pytestmark = pytest.mark.root

RunCli = Callable[..., subprocess.CompletedProcess[str]]


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
    (tmp_path / "here" / "logs").mkdir(parents=True)  # a lab's remains, without its lab.json
    assert Lab(tmp_path / "here").down(lab_config) == []


def test_down_where_there_is_nothing_of_a_lab_exits_2_and_creates_nothing(
    tmp_path: Path, lab_config: LabConfig, run_cli: RunCli
) -> None:
    missing, empty = tmp_path / "typo", tmp_path / "empty"
    empty.mkdir()
    (empty / ".lab.lock").touch()  # what an earlier `lab down` here left: not a lab
    for run_dir in (missing, empty):
        out = run_cli("lab", "down", "--run-dir", str(run_dir), "--prefix", lab_config.prefix)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.splitlines() == [
            f"error: --run-dir: no lab in {run_dir} (no lab.json, and no process, namespace or "
            f"link of a lab with prefix {lab_config.prefix!r}); is it mistyped? Give the run "
            "directory `lab up` used (./run unless --run-dir or STORMWATCH_LAB_DIR said "
            "otherwise); nothing was touched"
        ]
    assert not missing.exists()
    assert [p.name for p in empty.iterdir()] == [".lab.lock"]
    # The library's default, for a caller cleaning up after a failed `up` (the demo, the
    # tests): nothing to do, said by an empty list, and the error it is handling stays its.
    assert Lab(missing).down(lab_config) == [] and not missing.exists()


def test_down_of_a_lab_that_is_down_already_is_a_quiet_success(
    tmp_path: Path, lab_config: LabConfig, run_cli: RunCli
) -> None:
    paths = RunPaths.of(tmp_path / "lab")
    state = plan_state(paths, lab_config)
    state.phase = "down"
    StateStore(paths).save(state)
    out = run_cli("lab", "down", "--run-dir", str(paths.run_dir), "--prefix", lab_config.prefix)
    assert out.returncode == 0, out.stderr
    assert "lab down: nothing was left" in out.stderr


def test_down_without_any_file_of_the_lab_still_stops_its_marked_processes(
    tmp_path: Path, lab_config: LabConfig, run_cli: RunCli
) -> None:
    """The run directory is gone (deleted after a crash), a process of its lab lives on."""
    gone = RunPaths.of(tmp_path / "gone").run_dir
    env = {procs.LAB_MARKER_ENV: str(gone), "PATH": "/usr/bin:/bin"}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        out = run_cli("lab", "down", "--run-dir", str(gone), "--prefix", lab_config.prefix)
        assert out.returncode == 0, out.stdout + out.stderr
        assert orphan.wait(timeout=30) is not None
    finally:
        orphan.kill()
        orphan.wait(timeout=30)


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
