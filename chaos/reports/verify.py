"""Verification that nothing was lost: after an experiment, three checks (issue 5, item 4).

1. **Loss**: every step the job completed after recovering has the loss of a
   fault-free baseline run of the same settings. ``identical`` compares
   ``float.hex`` bitwise (the trainer's resume is bitwise on CPU, see
   docs/ARCHITECTURE.md "Checkpoints"); ``bounded`` allows a relative difference
   up to ``loss_rel_tolerance`` (elastic resizes re-shard: the documented bound is
   :data:`ELASTIC_LOSS_REL_BOUND`); ``skip`` does not compare. Taken from the
   post-mortem's :class:`~stormwatch.postmortem.LossCheck` (``identical``)
   or recomputed from the rank-0 logs (``bounded``).
2. **Checkpoint**: the job's latest complete checkpoint (``.metadata`` and the
   ``stormwatch-complete.json`` marker, :func:`stormwatch.trainer.checkpoint.store.scan`)
   has files matching the marker's CRC-32 checksums and loads: DCP reads every
   tensor back without a process group (``_load_state_dict_from_keys``). A job that
   saves in another format (a Lightning ``.ckpt``, a ``torch.save`` ``.pt``/``.pth`` file
   directly in that folder) has its newest such file loaded with
   ``torch.load(weights_only=True)`` (no code runs from the file; torch's zip format only,
   memory-mapped, not read into memory) and must hold a tensor; it has no checksums.
3. **No fault left applied**: the controller's ledger has no open fault of the
   experiment, and no node agent lists an ``injecting``/``applied`` fault
   (``GET /v1/faults``).

:func:`verify` never raises for what it finds; each check is ``ok`` True/False,
or None when it could not be made (the reason is in ``detail``).
"""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path
from typing import Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import FaultError, ServiceError
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.target import Target
from stormwatch.contracts.journal import ExperimentExpectations, Journal
from stormwatch.postmortem import ExperimentPostMortem
from stormwatch.telemetry.events import log_path
from stormwatch.telemetry.ranklogs import (
    RankLog,
    final_losses,
    read_job_logs,
    read_rank_log,
)
from stormwatch.trainer.checkpoint.store import checksum_mismatch, scan

#: Relative loss difference allowed after an elastic resize (world size changed on
#: restart: the data order and the reduction order change, so bitwise equality is
#: lost). 5 %: after a resize the loss curve of a small model stays within a few
#: percent of the fixed-size run over tens of steps (measured on the lab's 4-rank job).
ELASTIC_LOSS_REL_BOUND = 0.05

LossMode = Literal["identical", "bounded", "skip"]
_LOSS_MODES: dict[str, LossMode] = {"identical": "identical", "bounded": "bounded", "skip": "skip"}


class Check(BaseModel):
    """One verification: ``ok`` None when it could not be made (``detail`` says why)."""

    model_config = ConfigDict(extra="forbid")

    ok: bool | None = None
    detail: str = ""


class Verification(BaseModel):
    """The three checks of one experiment (``verification.json`` beside the journal)."""

    model_config = ConfigDict(extra="forbid")

    loss: Check = Field(default_factory=Check)
    checkpoint: Check = Field(default_factory=Check)
    faults_cleared: Check = Field(default_factory=Check)

    @property
    def ok(self) -> bool:
        """No check failed (a check that could not be made is not a failure)."""
        return all(c.ok is not False for c in (self.loss, self.checkpoint, self.faults_cleared))

    def failures(self) -> list[str]:
        """``name: detail`` of each failed check."""
        return [
            f"{name}: {check.detail}"
            for name, check in (
                ("loss", self.loss),
                ("checkpoint", self.checkpoint),
                ("faults", self.faults_cleared),
            )
            if check.ok is False
        ]


def check_loss(
    pm: ExperimentPostMortem,
    rank0: RankLog | None,
    baseline: RankLog | None,
    *,
    mode: LossMode,
    rel_tolerance: float,
) -> Check:
    """Loss after recovery vs. the baseline (see the module docstring)."""
    if mode == "skip":
        return Check(ok=None, detail="not compared (expect.loss: skip)")
    if baseline is None:
        return Check(ok=None, detail="no baseline run")
    if mode == "identical":
        loss = pm.loss
        if loss.identical is None and rank0 is not None:
            # No restart (a freeze, a slowdown, a GPU fault): every step must match.
            return _bitwise(final_losses(rank0), final_losses(baseline))
        if loss.identical is None:
            return Check(ok=None, detail=loss.note or "nothing to compare")
        if loss.identical:
            return Check(
                ok=True, detail=f"{loss.compared_steps} steps bitwise equal from {loss.from_step}"
            )
        first = loss.mismatches[0]
        return Check(
            ok=False,
            detail=f"{len(loss.mismatches)} of {loss.compared_steps} steps differ, first at "
            f"step {first.step}: {float.fromhex(first.experiment_hex):.6g} vs baseline "
            f"{float.fromhex(first.baseline_hex):.6g}",
        )
    if rank0 is None:
        return Check(ok=None, detail="the experiment's rank-0 log is missing")
    expected = final_losses(baseline)
    actual = final_losses(rank0)
    common = sorted(set(expected) & set(actual))
    if not common:
        return Check(ok=None, detail="no step has a loss in both runs")
    worst_step, worst = common[0], 0.0
    for step in common:
        a, b = float.fromhex(actual[step]), float.fromhex(expected[step])
        rel = abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) else math.inf
        if rel > worst:
            worst_step, worst = step, rel
    ok = worst <= rel_tolerance
    return Check(
        ok=ok,
        detail=f"{len(common)} steps, worst relative difference {worst:.2%} at step "
        f"{worst_step} ({'<=' if ok else '>'} {rel_tolerance:.2%})",
    )


def _bitwise(actual: dict[int, str], expected: dict[int, str]) -> Check:
    """Every step both runs logged has the same ``loss_hex``."""
    common = sorted(set(actual) & set(expected))
    if not common:
        return Check(ok=None, detail="no step has a loss in both runs")
    differ = [s for s in common if actual[s] != expected[s]]
    if differ:
        return Check(
            ok=False,
            detail=f"{len(differ)} of {len(common)} steps differ, first at step {differ[0]}",
        )
    return Check(ok=True, detail=f"{len(common)} steps bitwise equal (no restart)")


def check_checkpoint(
    checkpoint_dir: Path, *, load: bool = True, expected_from_step: int | None = None
) -> Check:
    """The latest complete checkpoint under ``checkpoint_dir`` matches its checksums and loads.

    ``expected_from_step``: the last step the job completed, when below its first
    checkpoint step (no checkpoint is expected yet: not a failure).
    """
    found = scan(checkpoint_dir)
    latest = found.latest
    if latest is None:
        if expected_from_step is not None:
            return Check(
                ok=None,
                detail=f"no checkpoint expected yet (the job stopped at step {expected_from_step})",
            )
        if not checkpoint_dir.is_dir():
            return Check(ok=None, detail=f"no checkpoint folder {checkpoint_dir}")
        foreign = _check_torch_saves(checkpoint_dir, load=load)
        if foreign is not None:
            return foreign
        return Check(ok=False, detail=f"no complete checkpoint in {checkpoint_dir}")
    mismatch = checksum_mismatch(latest)
    if mismatch is not None:
        return Check(ok=False, detail=f"{latest.path.name}: {mismatch}")
    detail = f"{latest.path.name} complete, {len(latest.marker.checksums)} files match CRC-32"
    if load:
        try:
            tensors = _load(latest.path)
        except Exception as exc:  # DCP raises many types for a bad checkpoint
            return Check(ok=False, detail=f"{latest.path.name} does not load: {exc}")
        detail += f", loads ({tensors} entries)"
    return Check(ok=True, detail=detail)


#: File suffixes of checkpoints saved with ``torch.save`` (Lightning's ``ModelCheckpoint``
#: writes ``.ckpt``; ``.pt``/``.pth`` are PyTorch's conventions).
_TORCH_SAVE_SUFFIXES = (".ckpt", ".pt", ".pth")


def _torch_save_files(folder: Path) -> list[Path]:
    """Regular ``torch.save`` checkpoint files directly in ``folder``, oldest first (links
    such as Lightning's ``last.ckpt`` are left out: they name one of the files).

    Raises:
        OSError: ``folder`` cannot be listed (gone, or no search permission).
    """
    files = [
        p
        for p in folder.iterdir()
        if p.suffix in _TORCH_SAVE_SUFFIXES and not p.is_symlink() and p.is_file()
    ]
    return sorted(files, key=lambda p: (_mtime_ns(p), p.name))


def _mtime_ns(path: Path) -> int:
    """``path``'s mtime; -1 (oldest) for a file removed since it was listed (a job still
    pruning its checkpoints)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _check_torch_saves(folder: Path, *, load: bool) -> Check | None:
    """The newest ``torch.save`` checkpoint in ``folder`` (None when it holds none)."""
    try:
        files = _torch_save_files(folder)
    except OSError as exc:
        return Check(ok=False, detail=f"cannot list {folder}: {exc}")
    return _check_torch_save(files[-1], load=load) if files else None


def _check_torch_save(path: Path, *, load: bool) -> Check:
    """The newest ``torch.save`` checkpoint of a job that does not save in stormwatch's
    format loads with ``weights_only=True`` and holds at least one tensor (no checksums
    to match). Only torch's zip format (the default since torch 1.6) is loaded: it is
    memory-mapped, whereas an older file would be read into memory at whatever size its
    header claims. A file name that is not UTF-8 is not loaded (torch takes ``str`` paths)."""
    import zipfile

    name = os.fsencode(path.name).decode("utf-8", "backslashreplace")
    if name != path.name:
        return Check(ok=None, detail=f"{name}: a file name that is not UTF-8, not loaded")
    if not load:
        return Check(ok=None, detail=f"{name}: a torch.save checkpoint, not loaded")
    if not zipfile.is_zipfile(path):
        if _head(path).startswith(_LEGACY_TORCH_SAVE):
            return Check(
                ok=None, detail=f"{name}: torch.save's format before torch 1.6, not loaded"
            )
        return Check(ok=False, detail=f"{name} does not load: not a torch.save file")
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch.load raises many types for a bad file
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check(ok=False, detail=f"{name} does not load: {why}")
    tensors = _tensors(state)
    if tensors == 0:
        return Check(ok=False, detail=f"{name} loads but holds no tensor: not a checkpoint")
    return Check(
        ok=True,
        detail=f"{name} (torch.save, no checksums) loads ({_count(state)} entries, "
        f"{tensors} tensors)",
    )


#: How a ``torch.save`` file of the format before torch 1.6 starts: a protocol-2 pickle
#: of its magic number, the long 0x1950a86a20f9469cfc6c (torch/serialization.py).
_LEGACY_TORCH_SAVE = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def _head(path: Path) -> bytes:
    """The first bytes of ``path``; opened without blocking (a FIFO put in its place since
    it was listed must not hang the check); empty when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return os.read(fd, len(_LEGACY_TORCH_SAVE))
    except OSError:
        return b""
    finally:
        os.close(fd)


def _tensors(value: object) -> int:
    """Tensors in nested dicts, lists and tuples of a loaded ``torch.save`` state."""
    import torch

    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensors(v) for v in value)
    return 0


def _load(path: Path) -> int:
    """Load every entry of the DCP checkpoint at ``path`` in this process; returns the count."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        # "torch.distributed is unavailable or uninitialized, assuming ... a single process":
        # exactly what is meant here.
        warnings.simplefilter("ignore", UserWarning)
        state = _load_state_dict_from_keys(checkpoint_id=str(path))
    return _count(state)


def _count(value: object) -> int:
    if isinstance(value, dict):
        return sum(_count(v) for v in value.values())
    return 1


async def check_faults_cleared(
    journal: Journal, target: Target, session: aiohttp.ClientSession
) -> Check:
    """No open fault of the experiment in the ledger, none active on any node agent."""
    problems: list[str] = []
    path = ledger_path(target.run_dir)
    if path.exists():
        ledger = Ledger(path, create=False)
        problems += [
            f"ledger: {e.id} ({e.kind}) still {e.state}"
            for e in ledger.open_faults(experiment_id=journal.experiment_id)
        ]
    token = _token(target.agent_token_file)
    if target.agents and token is None:
        return Check(ok=None, detail="no agent token file: cannot list the agents' faults")
    unanswered: list[str] = []
    agents = AgentClient(session)
    for agent in target.agents:
        try:
            records = await agents.faults(agent.fault_api, token or "")
        except (ServiceError, FaultError) as exc:
            unanswered.append(f"{agent.node}: {exc}")
            continue
        problems += [
            f"{agent.node}: fault {r.id} ({r.kind}) still {r.state.value}"
            for r in records
            if r.active
        ]
    if problems:
        return Check(ok=False, detail="; ".join(problems))
    if unanswered:
        return Check(ok=None, detail="agents did not answer: " + "; ".join(unanswered))
    return Check(ok=True, detail=f"ledger and {len(target.agents)} agent(s): no fault left applied")


def _before_first_checkpoint(journal: Journal, rank0: RankLog | None) -> int | None:
    """The last step rank 0 completed when it is below the job's first checkpoint step."""
    job = journal.facts().job
    every = job.checkpoint_every if job is not None else None
    last = rank0.last_step if rank0 is not None else None
    step = last.step if last is not None and last.step is not None else 0
    if every is not None and step < every:
        return step
    return None


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


async def verify(
    journal: Journal,
    pm: ExperimentPostMortem,
    *,
    target: Target | None,
    rank0: RankLog | None,
    baseline: RankLog | None,
    loss_mode: LossMode = "identical",
    loss_rel_tolerance: float = ELASTIC_LOSS_REL_BOUND,
) -> Verification:
    """Run the three checks for one finished experiment (``target`` None: no agent check)."""
    result = Verification()
    result.loss = check_loss(pm, rank0, baseline, mode=loss_mode, rel_tolerance=loss_rel_tolerance)
    if journal.job is not None:
        checkpoints = Path(journal.job.log_dir).parent / "checkpoints"
        early = _before_first_checkpoint(journal, rank0)
        result.checkpoint = await asyncio.to_thread(
            check_checkpoint, checkpoints, expected_from_step=early
        )
    else:
        result.checkpoint = Check(ok=None, detail="no job")
    if target is not None:
        async with aiohttp.ClientSession() as session:
            result.faults_cleared = await check_faults_cleared(journal, target, session)
    return result


def write_verification(
    experiment_dir: Path,
    journal: Journal,
    pm: ExperimentPostMortem,
    *,
    target: Target | None,
    baseline_log_dir: Path | None,
    loss_mode: LossMode | None = None,
    loss_rel_tolerance: float | None = None,
) -> Verification:
    """:func:`verify` one finished experiment and write ``verification.json`` beside its journal.

    The loss mode and bound default to the experiment's ``expect`` section (from the journal).
    """
    expect = journal.facts().expect or ExperimentExpectations()
    mode = _LOSS_MODES.get(loss_mode or expect.loss or "identical", "identical")
    bound = loss_rel_tolerance
    if bound is None:
        given = expect.loss_rel_tolerance
        bound = given if given is not None else ELASTIC_LOSS_REL_BOUND
    rank0 = read_job_logs(journal.job.log_dir).get(0) if journal.job is not None else None
    baseline = None
    if baseline_log_dir is not None and log_path(Path(baseline_log_dir), 0).exists():
        baseline = read_rank_log(log_path(Path(baseline_log_dir), 0), 0)
    result = asyncio.run(
        verify(
            journal,
            pm,
            target=target,
            rank0=rank0,
            baseline=baseline,
            loss_mode=mode,
            loss_rel_tolerance=bound,
        )
    )
    (Path(experiment_dir) / "verification.json").write_text(
        result.model_dump_json(indent=2), encoding="utf-8"
    )
    return result


__all__ = [
    "ELASTIC_LOSS_REL_BOUND",
    "Check",
    "Verification",
    "check_checkpoint",
    "check_faults_cleared",
    "check_loss",
    "verify",
    "write_verification",
]
