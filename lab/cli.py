"""``stormwatch lab``: start, inspect and stop the local lab; run jobs in it."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from stormwatch.errors import ConfigError, StormwatchError
from stormwatch.lab.config import JobSpec, LabConfig
from stormwatch.lab.jobs import elastic
from stormwatch.lab.lab import Lab, ProgressEvent
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.services import definitions as services
from stormwatch.lab.state import JobResult
from stormwatch.lab.status import render_status
from stormwatch.lab.teardown import removed_summary
from stormwatch.telemetry.events import parse_event

#: Default run directory (``--run-dir``, environment ``STORMWATCH_LAB_DIR``): ``./run``,
#: the same default as ``stormwatch chaos``, so ``lab up`` then ``chaos run`` just work.
DEFAULT_RUN_DIR = Path("run")

_MARKS = {
    "create": "[green]+[/]",
    "start": "[cyan]>[/]",
    "ready": "[green]✓[/]",
    "remove": "[yellow]-[/]",
}

run_dir_option = click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_RUN_DIR,
    envvar="STORMWATCH_LAB_DIR",
    show_default=True,
    show_envvar=True,
    help="Run directory of the lab (lab.json, logs, metrics, jobs).",
)


#: ``lab up``/``lab down`` options that build a LabConfig: (flag, field, type, help).
_CONFIG_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--nodes", "nodes", int, "Nodes (network namespaces)."),
    ("--nproc-per-node", "nproc_per_node", int, "torchrun workers per node."),
    ("--subnet", "subnet", str, "IPv4 subnet of the lab bridge."),
    ("--prefix", "prefix", str, "Prefix of bridge, namespace and veth names."),
    ("--prometheus-port", "prometheus_port", int, "Prometheus port on 127.0.0.1."),
    ("--alertmanager-port", "alertmanager_port", int, "Alertmanager port on 127.0.0.1."),
    ("--responder-port", "responder_port", int, "Responder port on 127.0.0.1."),
    (
        "--slurm/--no-slurm",
        "slurm",
        bool,
        "Run a Slurm cluster over the nodes (munged, slurmctld, a slurmd per node).",
    ),
    ("--slurmctld-port", "slurmctld_port", int, "slurmctld's port (root namespace)."),
    (
        "--scheduler",
        "scheduler",
        click.Choice(["slurm", "direct"]),
        "How jobs start: sbatch of deploy/slurm/train.sbatch, or one torchrun per node "
        "[default: slurm with --slurm].",
    ),
    (
        "--grace-period",
        "grace_period_s",
        int,
        "Seconds every stop gives processes between SIGTERM and SIGKILL (Slurm's KillWait).",
    ),
)


def _config_options(func: Any, *, listed: Mapping[str, str] | None = None) -> Any:
    """Options that build a LabConfig (defaults: LabConfig's). ``listed``: the fields
    ``--help`` shows, with their help text there ("": the usual); the others are accepted,
    hidden. None: all."""
    defaults = LabConfig()
    for flag, field, kind, text in reversed(_CONFIG_FLAGS):
        default = getattr(defaults, field)
        default = default if default is None or isinstance(default, (bool, int)) else str(default)
        typed = {} if kind is bool else {"type": kind}
        shown = default is not None
        hidden = listed is not None and field not in listed
        text = (listed or {}).get(field) or text
        option = click.option(
            flag, field, default=default, show_default=shown, help=text, hidden=hidden, **typed
        )
        func = option(func)
    return func


def _sweep_options(func: Any) -> Any:
    """``lab down``'s: ``lab up``'s options, accepted (one command line serves both), of
    which only those a sweep without lab.json reads are listed."""
    slurm = "Whether the lab ran Slurm (stop its daemons)."
    nodes = "Nodes the lab had (their Slurm runtime files)."
    return _config_options(func, listed={"nodes": nodes, "prefix": "", "slurm": slurm})


def _config(**values: Any) -> LabConfig:
    return LabConfig(**values)


def _console() -> Console:
    # soft_wrap: paths stay on one line (copy-pastable) when stderr is not a terminal.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _printer(console: Console) -> Any:
    started = time.monotonic()

    def show(event: ProgressEvent) -> None:
        mark = _MARKS.get(event.kind, "[dim]·[/]")
        console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {mark} {event.message}")

    return show


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so a terminated ``lab up`` still removes what it created."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class LabHooks:
    """What runs around the lab's commands, given by whoever composes the command line
    (the root ``stormwatch`` command, :mod:`stormwatch.cli`, passes it as the click
    context's object), so that the lab imports none of it.

    Attributes:
        before_command: called with the run directory before ``up``, ``down`` and
            ``status`` act: the chaos controller's overdue-fault reaper (a frozen rank
            must not outlive its TTL once its controller and reaper died; the controller
            imports the lab, so the lab cannot import it).
    """

    before_command: Callable[[Path], object]


def _reap_overdue(run_dir: Path) -> None:
    """Revert chaos faults past their TTL first (:attr:`LabHooks.before_command`). A
    ledger that cannot be read is only reported. The lab group run on its own (without
    the root command, e.g. in a test) has no hooks: nothing runs first."""
    hooks = click.get_current_context().find_object(LabHooks)
    if hooks is None:
        return
    try:
        hooks.before_command(run_dir)
    except StormwatchError as exc:
        _console().print(f"[yellow]could not check the fault ledger:[/] {escape(str(exc))}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab() -> None:
    """Start, inspect and stop the local lab cluster (needs root).

    The lab is a bridge and one network namespace per node on this machine, an
    agent and a slurmd in each namespace, munged and slurmctld beside them, and
    Prometheus, Alertmanager and the responder on 127.0.0.1. Jobs are submitted with
    sbatch (deploy/slurm/train.sbatch) and run one torchrun per namespace.

    \b
    Typical session:
      stormwatch lab up
      stormwatch lab train --job baseline --steps 60
      stormwatch lab wait --job baseline
      stormwatch lab down
    """


@lab.command()
@run_dir_option
@_config_options
@click.option(
    "--startup-timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds to wait for every service to become healthy.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Rebuild a broken lab even though jobs run in it (they are killed).",
)
def up(run_dir: Path, startup_timeout: float, force: bool, **values: Any) -> None:
    """Create the lab: bridge, namespaces, Slurm, agents, Prometheus, Alertmanager, responder.

    Prints progress, waits until every service is healthy and Prometheus scrapes
    every agent, and writes <run-dir>/lab.json. On failure or Ctrl-C it removes
    everything it created.

    On a lab that is up but has dead services, restarts only those (jobs keep
    running). A lab that must be rebuilt is not while jobs run in it, unless --force.
    """
    config = _config(startup_timeout=startup_timeout, **values)
    console = _console()
    _reap_overdue(run_dir)
    with _sigterm_interrupts():
        state = Lab(run_dir).up(config, progress=_printer(console), force=force)
    console.print(f"[bold green]lab up[/] in {state.run_dir}")
    console.print(f"  Prometheus   {state.prometheus_url}")
    console.print(f"  Alertmanager {state.alertmanager_url}")
    console.print(f"  Responder    {state.responder_url}")
    if state.slurm is not None:
        console.print(f"  Slurm        {state.slurm.describe()}")
    for node in state.nodes:
        console.print(f"  {node.name:<12} {node.agent_url} (netns {node.netns})")
    hint = services.grafana_hint(RunPaths.of(state.run_dir).grafana_dir)
    console.print(escape(hint), soft_wrap=True)


@lab.command()
@run_dir_option
@_sweep_options
def down(run_dir: Path, **values: Any) -> None:
    """Stop every lab process and remove its namespaces, veths and bridge.

    Uses <run-dir>/lab.json when present; otherwise sweeps the names the options
    describe (--prefix, --nodes; --no-slurm: no Slurm daemons). Safe to run twice, or
    after a crashed `lab up`; a run directory with nothing of a lab in it (and nothing of
    one left to sweep) is an error. Never touches a lab recorded in another run directory:
    without lab.json here, it refuses when another run directory owns the prefix. Accepts
    every option of `lab up` (unlisted here), so one command line serves both.
    """
    console = _console()
    _reap_overdue(run_dir)
    removed = Lab(run_dir).down(_config(**values), progress=_printer(console), missing_ok=False)
    console.print("[bold]lab down[/]: " + escape(removed_summary(removed)))


@lab.command()
@run_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(run_dir: Path, as_json: bool) -> int:
    """Show nodes, services, their health, and jobs (exit 0 only when healthy).

    Chaos faults past their TTL are reverted first. One line per row; on a terminal
    narrower than 120 columns the namespaces, addresses, URLs and job folders are
    left out (--json has everything).
    """
    _reap_overdue(run_dir)
    result = Lab(run_dir).status()
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        render_status(result, Console(highlight=False), up_flags=_CONFIG_FLAGS)
    return 0 if result.healthy else 1


@lab.command()
@run_dir_option
@click.option("--job", "name", required=True, help="Job name (also its rendezvous id and folder).")
@click.option("--steps", type=int, required=True, help="Steps to train.")
@click.option(
    "--checkpoint-every",
    type=int,
    default=10,
    show_default=True,
    help="Steps between checkpoints (0: never).",
)
@click.option(
    "--step-delay", type=float, default=0.0, show_default=True, help="Extra seconds per step."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--max-restarts", type=int, default=3, show_default=True, help="torchrun --max-restarts."
)
@click.option(
    "--job-nodes",
    "nodes",
    type=int,
    default=None,
    help="Nodes of the job (the first ones of the lab). [default: 2, or every node of a "
    "smaller lab]",
)
@click.option(
    "--min-nodes",
    type=int,
    default=None,
    help="Elastic job: torchrun --nnodes MIN_NODES:<job nodes>; a lost node shrinks the job "
    "(dp follows the nodes present), a rejoined one grows it back. [default: fixed size]",
)
@click.option(
    "--global-batch",
    type=int,
    default=None,
    help="Sequences per optimizer step, constant across resizes. [default: elastic: "
    "micro-batch x lcm(min-nodes..nodes); fixed: micro-batch x dp]",
)
@click.option("--wait/--no-wait", default=False, show_default=True, help="Wait for the job to end.")
@click.option(
    "--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait with --wait."
)
def train(
    run_dir: Path,
    name: str,
    steps: int,
    checkpoint_every: int,
    step_delay: float,
    seed: int,
    max_restarts: int,
    nodes: int | None,
    min_nodes: int | None,
    global_batch: int | None,
    wait: bool,
    timeout: float,
) -> int:
    """Start a training job: one torchrun per node, dp = nodes, tp = workers per node
    (submitted with sbatch on a Slurm lab; elastic jobs start directly).

    Returns at once (the job runs detached) unless --wait is given. With
    --min-nodes the job is elastic: `stormwatch lab rejoin` brings a lost node back.
    """
    spec = _job_spec(
        name=name,
        steps=steps,
        checkpoint_every=checkpoint_every,
        step_delay=step_delay,
        seed=seed,
        max_restarts=max_restarts,
        nodes=nodes,
        min_nodes=min_nodes,
        global_batch=global_batch,
    )
    the_lab = Lab(run_dir)
    problem = elastic.min_nodes_problem(the_lab.state, spec)
    if problem is not None:
        raise ConfigError(problem)
    info = the_lab.start_job(spec)
    console = _console()
    console.print(f"[bold]job {info.name}[/] started; logs in {info.log_dir}")
    for node, pid in info.node_pids.items():
        console.print(f"  {node}: torchrun pid {pid}, output {info.node_logs[node]}")
    if not wait:
        return 0
    return _report(_wait_with_progress(the_lab, name, timeout, console), console)


#: ``lab train``'s flag for each JobSpec field it sets (errors name the flag, not the field).
_JOB_FLAGS = {
    "name": "--job",
    "steps": "--steps",
    "checkpoint_every": "--checkpoint-every",
    "step_delay": "--step-delay",
    "seed": "--seed",
    "max_restarts": "--max-restarts",
    "nodes": "--job-nodes",
    "min_nodes": "--min-nodes",
    "global_batch": "--global-batch",
}


def _job_spec(**values: Any) -> JobSpec:
    """``JobSpec(**values)``, its validation errors naming ``lab train``'s flags.

    Raises:
        ConfigError: one ``--flag: problem (got value)`` per invalid value, ``; ``-joined.
    """
    try:
        return JobSpec(**values)
    except ConfigError as exc:
        cause = exc.__cause__  # JobSpec wraps pydantic's error: its parts name the fields
        if not isinstance(cause, ValidationError):
            raise
        problems = []
        for err in cause.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            flag = _JOB_FLAGS.get(field, f"JobSpec.{field}")
            message = str(err["msg"]).removeprefix("Value error, ")
            message = message[:1].lower() + message[1:]  # "Input should be" -> "input should be"
            problems.append(f"{flag}: {message} (got {err['input']!r})")
        raise ConfigError("; ".join(problems)) from cause


def _current_step(log_dir: Path) -> int | None:
    """The highest step in the job's rank logs' last lines (None before the first step)."""
    best: int | None = None
    for path in log_dir.glob("rank*.jsonl"):
        try:
            with path.open("rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - 4096))
                lines = handle.read().decode("utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            with contextlib.suppress(ValueError):  # the tail's cut first line, a torn last one
                step = getattr(parse_event(line), "step", None)  # a start event has none
                if isinstance(step, int):
                    best = step if best is None else max(best, step)
                    break
    return best


def _wait_with_progress(the_lab: Lab, name: str, timeout: float, console: Console) -> JobResult:
    """``Lab.wait_job``, with a live line (the job's current step) on a terminal."""
    if not console.is_terminal:
        return the_lab.wait_job(name, timeout=timeout)
    info = the_lab.job(name)
    steps = info.spec.steps
    deadline = time.monotonic() + timeout
    with console.status(f"job {name}: starting") as status:
        while time.monotonic() < deadline:
            result = the_lab.job_result(name)
            if all(code is not None for code in result.exit_codes.values()):
                break
            step = _current_step(Path(info.log_dir))
            status.update(
                f"job {name}: "
                + (
                    "starting (torch import, rendezvous)"
                    if step is None
                    else f"step {step}/{steps}"
                )
            )
            time.sleep(1.0)
    return the_lab.wait_job(name, timeout=max(0.0, deadline - time.monotonic()))


def _report(result: JobResult, console: Console) -> int:
    exit_codes = result.exit_codes
    ok = bool(exit_codes) and all(code == 0 for code in exit_codes.values())
    for node, code in exit_codes.items():
        shown = "unknown" if code is None else str(code)
        colour = "green" if code == 0 else "red"
        console.print(f"  {node}: torchrun exit code [{colour}]{shown}[/]")
    if result.detail:
        console.print(f"  [red]why:[/] {escape(result.detail)}", soft_wrap=True)
    console.print("[bold green]job succeeded[/]" if ok else "[bold red]job failed[/]")
    return 0 if ok else 1


@lab.command()
@run_dir_option
@click.option("--job", "name", required=True, help="Job name.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait.")
def wait(run_dir: Path, name: str, timeout: float) -> int:
    """Wait for every node's torchrun of a job; print their exit codes (exit 0 when all are 0).

    On a terminal, shows the job's current step while waiting; when a node failed,
    prints the last error lines of its torchrun log.
    """
    console = _console()
    result = _wait_with_progress(Lab(run_dir), name, timeout, console)
    return _report(result, console)


@lab.command()
@run_dir_option
@click.option("--job", "name", required=True, help="Elastic job name (started with --min-nodes).")
@click.option("--node", required=True, help="Node whose torchrun is started again, e.g. node1.")
def rejoin(run_dir: Path, name: str, node: str) -> None:
    """Start a lost node's torchrun again in a running elastic job; the job grows back."""
    info = Lab(run_dir).rejoin_job_node(name, node)
    _console().print(
        f"[bold]{node}[/] rejoins job {name}: torchrun pid {info.node_pids[node]}, "
        f"output {info.node_logs[node]}"
    )


@lab.command()
@run_dir_option
@click.option("--job", "name", required=True, help="Job name.")
@click.option(
    "--grace",
    type=float,
    default=None,
    help="Seconds between SIGTERM and SIGKILL [default: the lab's --grace-period].",
)
def stop(run_dir: Path, name: str, grace: float | None) -> None:
    """Stop a running job (SIGTERM to torchrun and its workers, SIGKILL after the grace
    period, until every process of it is gone)."""
    result = Lab(run_dir).stop_job(name, grace=grace)
    _report(result, _console())


__all__ = ["DEFAULT_RUN_DIR", "lab"]
