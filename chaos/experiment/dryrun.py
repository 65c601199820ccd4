"""``--dry-run``: print what an experiment would do, with its targets resolved; run nothing.

The targets are resolved against the job's shape: the lab's (``shape``) when one is
given, else the file's (``job.nodes`` x ``job.nproc_per_node``), else the default
lab's two nodes (``job.world_size`` / 2 ranks each).
"""

from __future__ import annotations

from pathlib import Path

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
from stormwatch.faults import ExperimentFault, Target

#: Nodes of the default lab (``stormwatch lab up``), for files that do not fix their shape.
DEFAULT_LAB_NODES = 2


def describe_provider(provider: Provider) -> str:
    """One line for a probe provider (``prometheus: count(...) == 4``)."""
    data = provider.model_dump(mode="json", exclude={"type", "tolerance"}, exclude_none=True)
    fields = ", ".join(f"{k}={' '.join(str(v).split())}" for k, v in data.items())
    tolerance = getattr(provider, "tolerance", None)
    if tolerance is not None:
        fields += f" {tolerance.describe()}"
    return f"{provider.type}: {fields}"


def plan_shape(experiment: Experiment, shape: Shape | None = None) -> tuple[Shape | None, str]:
    """The shape to resolve targets against, and where it came from."""
    if shape is not None:
        return shape, "the lab"
    fixed = static_shape(experiment)
    if fixed is not None:
        return fixed, "job.nodes x job.nproc_per_node"
    world = experiment.job.fixed_world_size
    if world is not None and world % DEFAULT_LAB_NODES == 0:
        return (
            Shape.generic(DEFAULT_LAB_NODES, world // DEFAULT_LAB_NODES),
            f"job.world_size on the default {DEFAULT_LAB_NODES}-node lab",
        )
    return None, "unknown until run time"


def lab_shape(run_dir: Path) -> Shape | None:
    """The shape of the lab in ``run_dir`` when it is up (nodes in order, ranks per node)."""
    return target_shape(run_dir, None)


def target_shape(run_dir: Path, target_file: Path | None) -> Shape | None:
    """The shape of the target (``--target`` file, else ``<run-dir>/target.yaml``, else the
    lab in ``run_dir``) when it can be reached (nodes in order, ranks per node); None when
    it cannot (the plan then uses the file's shape).

    Raises:
        InvalidTargetFile: ``target_file`` is not valid.
    """
    from stormwatch.chaos.errors import LabNotReady
    from stormwatch.chaos.platform_target import resolve_target

    try:
        target = resolve_target(run_dir, target_file)
    except (LabNotReady, OSError):
        return None
    nodes = tuple(a.node for a in target.agents)
    if not nodes or target.world_size % len(nodes):
        return None
    return Shape(nodes, target.world_size // len(nodes))


def print_plan(
    experiment: Experiment, path: Path, console: Console, shape: Shape | None = None
) -> str | None:
    """Print the plan of ``experiment`` (from ``path``).

    Returns:
        Why a run would refuse the plan (faults that cannot be placed on the shape, or a
        blast radius exceeded), or None when it would start.
    """
    refused: str | None = None
    shape, source = plan_shape(experiment, shape)
    job = experiment.job
    p = console.print
    p(f"[bold]{escape(str(path))}[/]: {escape(experiment.title)}")
    layout = f"{shape.world_size} ranks on {len(shape.nodes)} nodes ({source})" if shape else source
    p(
        f"  job {job.name}-<run>: {job.steps} steps, checkpoint every {job.checkpoint_every}, "
        f"seed {job.seed}, {layout}"
    )
    p(f"  steady state: {escape(experiment.steady_state_hypothesis.title)}")
    for probe in experiment.steady_state_hypothesis.probes:
        p(
            f"    {escape('[' + '/'.join(probe.phases) + ']')} {probe.name}: "
            f"{escape(describe_provider(probe.provider))} (wait <= {probe.timeout_seconds:g} s)"
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
    if fault.traits.target is Target.NODE_SETS:
        return f"nodes {', '.join(nodes)}"
    if nodes:
        return f"node {nodes[0]}"
    rank = fault.target_rank()
    if rank is None:
        return "its own target"
    return (
        f"the node of rank {rank}" if fault.traits.target is Target.NODE_OR_RANK else f"rank {rank}"
    )


__all__ = [
    "DEFAULT_LAB_NODES",
    "describe_provider",
    "lab_shape",
    "plan_shape",
    "print_plan",
    "target_shape",
]
