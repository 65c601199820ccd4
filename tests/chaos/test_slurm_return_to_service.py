"""A Slurm target's return to service after a revert (:class:`SlurmNodes`), against a
recorded cluster: ``scontrol`` answers as slurmctld 22.05 does (``--oneliner`` node
records, ``Reason=<why> [<user>@<time>]``), through the one Slurm client's runner seam.
The live run (a node cut off until Slurm sets it DOWN) is in
tests/chaos/test_slurm_lab_scenarios.py."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.chaos.node_service import SlurmNodes
from stormwatch.platforms.errors import BackendError
from stormwatch.platforms.slurm import SlurmBackend, SlurmCommands
from stormwatch.platforms.slurm_readback import SlurmWait

NOW = time.time()


def _stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S")


class RecordedCluster:
    """Nodes whose ``State`` runs through a list (one entry per read, the last one stays);
    ``scontrol update ... State=RESUME`` makes a node IDLE (or is refused)."""

    def __init__(self, nodes: dict[str, tuple[list[str], str | None]], refuse: bool = False):
        self.nodes = {name: (list(states), reason) for name, (states, reason) in nodes.items()}
        self.refuse = refuse
        self.updates: list[str] = []

    def __call__(self, argv: Sequence[str]) -> str:
        if list(argv[:2]) == ["scontrol", "update"]:
            self.updates.append(" ".join(argv[2:]))
            if self.refuse:
                raise BackendError("scontrol update: exit status 1: Invalid node state specified")
            name = argv[2].removeprefix("NodeName=")
            self.nodes[name] = (["IDLE+NOT_RESPONDING", "IDLE"], None)
            return ""
        assert list(argv[:4]) == ["scontrol", "--oneliner", "show", "node"], argv
        lines = []
        for name in argv[4].split(","):
            states, reason = self.nodes[name]
            state = states.pop(0) if len(states) > 1 else states[0]
            line = f"NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State={state}"
            lines.append(line + (f" Reason={reason}" if reason else ""))
        return "\n".join(lines) + "\n"


def _nodes(cluster: RecordedCluster, tmp_path: Path) -> SlurmNodes:
    return SlurmNodes(
        SlurmBackend(
            diagnostics_dir=tmp_path,
            commands=SlurmCommands(runner=cluster),
            wait=SlurmWait(timeout_s=2.0, poll_s=0.01),
        )
    )


@pytest.mark.parametrize(
    ("states", "reason", "action", "resumed"),
    [
        (["IDLE"], None, "in service", False),
        (["ALLOCATED"], None, "in service", False),
        # Set DOWN by slurmctld during the fault: resumed, read back in service.
        (["DOWN+NOT_RESPONDING"], f"Not responding [slurm@{_stamp(NOW + 35)}]", "resumed", True),
        (["DOWN"], f"Not responding [slurm@{_stamp(NOW + 35)}]", "resumed", True),
        # Not answering, not DOWN yet: slurmctld's next ping brings it back by itself.
        (["IDLE+NOT_RESPONDING", "IDLE+NOT_RESPONDING", "IDLE"], None, "back", False),
        # An operator's drain or down, or a DOWN from before the fault: never touched.
        (["IDLE+DRAIN"], f"disk replacement [root@{_stamp(NOW + 5)}]", "left", False),
        (
            ["DOWN+DRAIN+NOT_RESPONDING"],
            f"Not responding [slurm@{_stamp(NOW + 35)}]",
            "left",
            False,
        ),
        (["DOWN"], f"bad DIMM [root@{_stamp(NOW + 35)}]", "left", False),
        (["DOWN+NOT_RESPONDING"], f"Not responding [slurm@{_stamp(NOW - 3600)}]", "left", False),
    ],
)
def test_a_node_slurm_set_down_during_the_fault_is_resumed_and_no_other(
    tmp_path: Path, states: list[str], reason: str | None, action: str, resumed: bool
) -> None:
    cluster = RecordedCluster({"node1": (states, reason), "node0": (["ALLOCATED"], None)})

    node0, node1 = _nodes(cluster, tmp_path).return_to_service(["node0", "node1"], since=NOW)

    assert (node0.node, node0.action) == ("node0", "in service")
    assert (node1.node, node1.action) == ("node1", action), node1
    assert node1.before is not None and states[0] in node1.before
    assert cluster.updates == (["NodeName=node1 State=RESUME"] if resumed else [])
    if resumed:
        assert node1.detail.startswith("resumed node1: IDLE after"), node1.detail
    if action == "left":
        assert "not touched" in node1.detail


def test_a_resume_slurm_refuses_is_a_failed_return_naming_slurms_answer(tmp_path: Path) -> None:
    reason = f"Not responding [slurm@{_stamp(NOW + 35)}]"
    cluster = RecordedCluster({"node1": (["DOWN+NOT_RESPONDING"], reason)}, refuse=True)

    [node1] = _nodes(cluster, tmp_path).return_to_service(["node1"], since=NOW)

    assert node1.action == "failed"
    assert "Invalid node state specified" in node1.detail


def test_a_node_that_stays_unreachable_is_a_failed_return_with_its_last_state(
    tmp_path: Path,
) -> None:
    cluster = RecordedCluster({"node1": (["IDLE+NOT_RESPONDING"], None)})

    [node1] = _nodes(cluster, tmp_path).return_to_service(["node1"], since=NOW)

    assert node1.action == "failed"
    assert "State=IDLE+NOT_RESPONDING" in node1.detail


def test_a_slurm_that_cannot_be_asked_fails_every_node_without_raising(tmp_path: Path) -> None:
    def broken(argv: Sequence[str]) -> str:
        raise BackendError("scontrol: not found; is this a Slurm login/controller node?")

    nodes = SlurmNodes(
        SlurmBackend(diagnostics_dir=tmp_path, commands=SlurmCommands(runner=broken))
    )

    returns = nodes.return_to_service(["node0", "node1"], since=NOW)

    assert [(r.node, r.action, r.before) for r in returns] == [
        ("node0", "failed", None),
        ("node1", "failed", None),
    ]
