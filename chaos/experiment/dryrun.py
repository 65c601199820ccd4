"""``--dry-run``: print what an experiment would do, with its targets resolved; run nothing.

The target (the lab, or a target file) is resolved first (:func:`target_shape`), and the
plan says which it is, or why it could not be resolved. The fault targets are resolved
against the job's shape: the target's when it was resolved, else the file's
(``job.nodes`` x ``job.nproc_per_node``), else the default lab's two nodes
(``job.world_size`` / 2 ranks each).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from stormwatch.chaos.errors import SelectionError
from stormwatch.chaos.experiment.model import (
    ActionActivity,
    Experiment,
    PauseActivity,
    ProbeActivity,
    Provider,
    RevertActivity,
    UntilActivity,
)
from stormwatch.chaos.experiment.selection import (
    Shape,
    blast_radius_problem,
    expand,
    static_shape,
    touched_ranks,
)
from stormwatch.faults import ExperimentFault
from stormwatch.faults import Target as FaultTarget

if TYPE_CHECKING:
    from stormwatch.chaos.target import Target

#: Nodes a job of the default lab runs on (``stormwatch lab up``: 3 nodes, the third a spare
#: no job uses until one is moved there), for files that do not fix their shape.
DEFAULT_LAB_NODES = 2


def describe_provider(provider: Provider) -> str:
    """One line for a probe provider (``prometheus: count(...) == 4``)."""
    data = provider.model_dump(mode="json", exclude={"type", "tolerance"}, exclude_none=True)
    fields = ", ".join(f"{k}={' '.join(str(v).split())}" for k, v in data.items())
    tolerance = getattr(provider, "tolerance", None)
    if tolerance is not None:
        fields += f" {tolerance.describe()}"
    return f"{provider.type}: {fields}"


@dataclass(frozen=True)
class ResolvedTarget:
    """What the dry run found of the target.

    Attributes:
        description: the target in words (:attr:`~stormwatch.chaos.target.Target.description`;
            the target file or lab asked for when it could not be resolved).
        shape: its job's nodes and ranks per node; None: not known before the run (a
            Slurm template's allocation) or not resolved.
        attach_job: the running job it attaches to (None: the run starts one).
        problem: why it could not be resolved (None: it was).
    """

    description: str
    shape: Shape | None = None
    attach_job: str | None = None
    problem: str | None = None


def plan_shape(
    experiment: Experiment, target: ResolvedTarget | None = None
) -> tuple[Shape | None, str]:
    """The shape to resolve targets against, and where it came from; with no shape, the
    job's world size in words and why its ranks' nodes are not known before the run."""
    if target is not None and target.shape is not None:
        return target.shape, target.description
    fixed = static_shape(experiment)
    if fixed is not None:
        return fixed, "job.nodes x job.nproc_per_node"
    world = experiment.job.fixed_world_size
    if world is not None and world % DEFAULT_LAB_NODES == 0:
        return (
            Shape.generic(DEFAULT_LAB_NODES, world // DEFAULT_LAB_NODES),
            f"job.world_size on the default lab's {DEFAULT_LAB_NODES} job nodes",
        )
    on_the_target = target is not None and target.problem is None
    if world is None:
        return None, "the world size is not in the job section: the target's, known at run time"
    if on_the_target:
        return None, f"{world} ranks (job.world_size)"
    return None, (
        f"{world} ranks (job.world_size); their nodes are known only at run time ({world} ranks "
        f"do not split evenly over the default lab's {DEFAULT_LAB_NODES} job nodes)"
    )


def lab_shape(run_dir: Path) -> Shape | None:
    """The shape of the lab in ``run_dir`` when it is up (nodes in order, ranks per node)."""
    return target_shape(run_dir, None).shape


def target_shape(run_dir: Path, target_file: Path | None) -> ResolvedTarget:
    """The target (``--target`` file, else ``<run-dir>/target.yaml``, else the lab in
    ``run_dir``) as far as it can be resolved without running anything: its words, its
    job's shape when known (the attached job's nodes, or the lab's), or why it could not
    be reached (the plan then uses the file's shape).

    Raises:
        InvalidTargetFile: ``target_file`` is not valid.
    """
    from stormwatch.chaos.errors import LabNotReady
    from stormwatch.chaos.platform_target import resolve_target

    try:
        target = resolve_target(run_dir, target_file)
    except (LabNotReady, OSError) as exc:  # said in the plan; run_commands decides the exit
        lab = f"the lab in {Path(run_dir).absolute()}"
        asked = f"--target {target_file}" if target_file is not None else lab
        return ResolvedTarget(asked, problem=str(exc) or type(exc).__name__)
    return resolved_from(target)


def resolved_from(target: Target) -> ResolvedTarget:
    """What the plan says of a resolved ``target``: its words, attached job, and its job's
    shape when the agents are the job's nodes (not a job submitted per run)."""
    nodes = tuple(a.node for a in target.agents)
    if not target.agents_are_job_nodes or not nodes or target.world_size % len(nodes):
        return ResolvedTarget(target.description, attach_job=target.attach_job)
    shape = Shape(nodes, target.world_size // len(nodes))
    return ResolvedTarget(target.description, shape=shape, attach_job=target.attach_job)


def refuse_unresolved(target: ResolvedTarget, target_file: Path | None) -> None:
    """After the plan: a ``--target`` file that could not be resolved fails the dry run
    (its help promises the fault targets resolved on it); the lab that is not up does not
    (the plan then uses the file's shape, as it says).

    Raises:
        LabNotReady: naming the target file and why it could not be resolved.
    """
    from stormwatch.chaos.errors import LabNotReady

    if target_file is not None and target.problem is not None:
        raise LabNotReady(
            f"--target {target_file}: could not be resolved ({target.problem}); the plan "
            "above uses the experiment's job shape, not the target's"
        )


def print_plan(
    experiment: Experiment, path: Path, console: Console, target: ResolvedTarget | None = None
) -> str | None:
    """Print the plan of ``experiment`` (from ``path``) on ``target`` (None: none was
    asked for; the file's shape, else the default lab's).

    Returns:
        Why a run would refuse the plan (faults that cannot be placed on the shape, or a
        blast radius exceeded), or None when it would start.
    """
    refused: str | None = None
    p = console.print
    p(f"[bold]{escape(str(path))}[/]: {escape(experiment.title)}")
    shape = _print_target_and_job(experiment, target, p)
    p(f"  steady state: {escape(experiment.steady_state_hypothesis.title)}")
    for probe in experiment.steady_state_hypothesis.probes:
        p(
            f"    {escape('[' + '/'.join(probe.phases) + ']')} {probe.name}: "
            f"{escape(describe_provider(probe.provider))} (wait <= {probe.timeout_seconds:g} s)"
        )
    over_once_sent = [
        a.fault.kind
        for a in experiment.method
        if isinstance(a, ActionActivity) and a.fault.traits.reverts_itself
    ]
    if over_once_sent:  # the runner's own check (chaos/execution/checks.py)
        p(
            f"    {escape('[after]')} job-recovered: every rank completes a step after the "
            f"{escape(over_once_sent[-1])}; added by the runner, since that fault is over "
            "once sent, and checked first"
        )
    for guard in experiment.safeguards:
        p(
            f"  safeguard {guard.name} every {guard.interval_seconds:g} s: "
            f"{escape(describe_provider(guard.provider))}"
        )
    p("  method:")
    for number, activity in enumerate(experiment.method, 1):
        p(f"    {number}. {escape(_activity(activity, shape))}")
    if experiment.rollbacks:
        p(f"  rollbacks (strategy {experiment.rollback_strategy}):")
        for activity in experiment.rollbacks:
            p(f"    - {escape(_activity(activity, shape))}")
    p("  then: every fault of the experiment still open is reverted (always)")
    if shape is not None:
        try:
            touched = touched_ranks(experiment, shape)
            problem = blast_radius_problem(experiment, shape)
        except SelectionError as exc:
            refused = f"cannot place the faults: {exc}"
            p(f"  [red]{escape(refused)}[/]")
        else:
            refused = problem
            limit = experiment.blast_radius.max_fraction_of_ranks
            verdict = "[red]REFUSED[/]" if problem else "[green]ok[/]"
            p(
                f"  blast radius: touches ranks {sorted(touched)} of {shape.world_size} "
                f"(limit {limit:g}): {verdict}"
            )
    expect = experiment.expect
    p(
        f"  expect: detected={expect.detect}"
        + (f" by {', '.join(expect.alerts)}" if expect.alerts else "")
        + f", loss {expect.loss}"
        + (f", category {expect.category}" if expect.category else "")
    )
    return refused


def _print_target_and_job(
    experiment: Experiment, target: ResolvedTarget | None, p: Callable[[str], None]
) -> Shape | None:
    """Print the target line (what was resolved, or why not) and the job line; return
    the shape the fault targets are resolved against."""
    shape, source = plan_shape(experiment, target)
    if target is not None and target.problem is not None:
        p(
            f"  [red]target: {escape(target.description)} could not be resolved: "
            f"{escape(target.problem)}[/]"
        )
        if shape is not None:
            source = f"{source}; not the target's"
    elif target is not None:
        p(f"  target: {escape(target.description)}")
        if target.shape is None:
            source = f"{source}; the target's nodes are known once its job is allocated"
    job = experiment.job
    layout = f"{shape.world_size} ranks on {len(shape.nodes)} nodes ({source})" if shape else source
    name = f"job {job.name}-<run>"
    if target is not None and target.attach_job is not None:
        name = f"job {target.attach_job} (attached: the target's job.attach, not started)"
    p(
        f"  {escape(name)}: {job.steps} steps, checkpoint every {job.checkpoint_every}, "
        f"seed {job.seed}, {escape(layout)}"
    )
    command = job.command_line()
    if command is not None:
        p(f"  command: {escape(shlex.join(command))}")
    return shape


def _activity(
    activity: ActionActivity | ProbeActivity | PauseActivity | UntilActivity | RevertActivity,
    shape: Shape | None,
) -> str:
    if isinstance(activity, ActionActivity):
        fields = activity.fault.model_dump(mode="json", exclude={"kind"}, exclude_none=True)
        if activity.target is not None:
            fields = {k: v for k, v in fields.items() if k not in ("rank", "node")}
        text = f"inject {activity.fault.kind} ({', '.join(f'{k}={v}' for k, v in fields.items())})"
        if activity.target is not None:
            selector = activity.target.model_dump(mode="json", exclude_none=True)
            text += f" on target {selector}"
        if shape is not None:
            try:
                where = [_where(f) for f in expand(activity, shape)]
                text += f" -> {'; '.join(where)}"
            except SelectionError as exc:
                text += f" -> cannot place: {exc}"
        if activity.when is not None:
            text += (
                f", when step {activity.when.step} is done (<= {activity.when.timeout_seconds:g} s)"
            )
        if activity.background:
            text += ", in the background"
        if activity.pause_after_seconds:
            text += f", then pause {activity.pause_after_seconds:g} s"
        return f"{activity.name}: {text}"
    if isinstance(activity, UntilActivity):
        return (
            f"{activity.name}: until {' '.join(activity.query.split())} "
            f"{activity.tolerance.describe()} (<= {activity.timeout_seconds:g} s, else fail)"
        )
    if isinstance(activity, ProbeActivity):
        return (
            f"{activity.name}: wait for {describe_provider(activity.provider)} "
            f"(<= {activity.timeout_seconds:g} s)"
        )
    if isinstance(activity, PauseActivity):
        return f"{activity.name}: pause {activity.seconds:g} s"
    return f"{activity.name}: revert open faults ({activity.scope})"


def _where(fault: ExperimentFault) -> str:
    nodes = fault.target_nodes()
    if fault.traits.target is FaultTarget.NODE_SETS:
        return f"nodes {', '.join(nodes)}"
    if nodes:
        return f"node {nodes[0]}"
    rank = fault.target_rank()
    if rank is None:
        return "its own target"
    return (
        f"the node of rank {rank}"
        if fault.traits.target is FaultTarget.NODE_OR_RANK
        else f"rank {rank}"
    )


__all__ = [
    "DEFAULT_LAB_NODES",
    "ResolvedTarget",
    "describe_provider",
    "lab_shape",
    "plan_shape",
    "print_plan",
    "refuse_unresolved",
    "resolved_from",
    "target_shape",
]
