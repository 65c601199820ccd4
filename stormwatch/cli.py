"""The ``stormwatch`` command: a click root that loads each component's group lazily.

Each component owns its own click group in ``stormwatch.<component>.cli``; the
root only gathers them, so ``stormwatch --help`` stays fast (no torch import)
and a broken optional component cannot take the others down.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from stormwatch import logs
from stormwatch.errors import StormwatchError

# name -> (module, attribute, one-line help shown by `stormwatch --help`)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("stormwatch.trainer.cli", "train", "Run the reference trainer (under torchrun)."),
    "run": (
        "stormwatch.telemetry.zerocode.cli",
        "run",
        "Run an unmodified job with telemetry (zero code changes).",
    ),
    "agent": ("stormwatch.agent.cli", "agent", "Run or inspect the per-node agent."),
    "lab": ("stormwatch.lab.cli", "lab", "Start, inspect and stop the local lab cluster."),
    "chaos": ("stormwatch.chaos.cli", "chaos", "Run and revert chaos experiments."),
    "alerts": ("stormwatch.alerts.cli", "alerts", "Alert rules, Alertmanager config, responder."),
    "plan": ("stormwatch.plan.cli", "plan", "Goodput (ETTR) planning at scale, what-ifs."),
    "dashboards": ("stormwatch.dashboards.cli", "dashboards", "Build and push Grafana dashboards."),
    "demo": (
        "stormwatch.chaos.gameday.demo",
        "demo",
        "Run the main job: lab + kill-rank experiment + report.",
    ),
}


def _reap_overdue_chaos_faults(run_dir: Path) -> None:
    """Revert the chaos faults past their TTL in ``run_dir``'s ledger (imported when called:
    most lab commands never need the controller)."""
    from stormwatch.chaos.cli import reap_overdue

    reap_overdue(run_dir)


def _lab_hooks() -> object:
    """The lab's commands first revert overdue chaos faults. The root wires the controller's
    reaper into the lab because the controller imports the lab, not the other way round."""
    from stormwatch.lab.cli import LabHooks

    return LabHooks(before_command=_reap_overdue_chaos_faults)


#: Top-level module -> the extra that installs it (pyproject.toml; the core, the agent's
#: install, leaves these out). tests/test_dependencies.py checks each against the extra.
EXTRA_OF_MODULE = {
    "torch": "trainer",
    "numpy": "reports",
    "matplotlib": "reports",
    "kubernetes": "kubernetes",
    "pytorch_lightning": "lightning",
}

#: name -> the object the root gives that component's group as its click context object.
_CONTEXT_OBJECTS: dict[str, Callable[[], object]] = {"lab": _lab_hooks}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr, _ = entry
        module = importlib.import_module(module_name)
        command = getattr(module, attr)
        if not isinstance(command, click.Command):  # pragma: no cover - programming error
            raise TypeError(f"{module_name}.{attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static help so `stormwatch --help` does not import every component.
        rows = [(name, help_) for name, (_, _, help_) in sorted(_COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    envvar=logs.FORMAT_ENV,
    show_envvar=True,
    help="Log lines on stderr: text, or json (one object per line, for log pipelines).",
)
@click.version_option(package_name="stormwatch")
@click.pass_context
def root(ctx: click.Context, verbose: int, log_format: logs.LogFormat) -> None:
    """stormwatch: observability and chaos testing for GPU training clusters.

    \b
    Quick start (root, Debian/Ubuntu):
      stormwatch demo            lab + kill-rank experiment + post-mortem
      stormwatch lab up          the lab: three nodes in network namespaces
      stormwatch chaos run experiments/kill-rank.yaml
    """
    logs.configure(max(logging.WARNING - 10 * verbose, logging.DEBUG), log_format)
    context_object = _CONTEXT_OBJECTS.get(ctx.invoked_subcommand or "")
    if context_object is not None:
        ctx.obj = context_object()


def _takes_value(command: click.Command, word: str) -> bool:
    """Whether option ``word`` of ``command`` takes the next word as its value (not a
    flag, and not written ``--name=value``)."""
    if "=" in word:
        return False
    for param in command.params:
        if isinstance(param, click.Option) and word in (*param.opts, *param.secondary_opts):
            return not param.is_flag and not param.count and param.nargs > 0
    return False


def _command_path(argv: list[str]) -> str:
    """The command ``argv`` names (``stormwatch lab status``), for a usage error click raised
    without its context (an option missing its value): the leading words that name groups
    and commands, options skipped."""
    command: click.Command = root
    path = ["stormwatch"]
    words = iter(argv)
    for word in words:
        if word.startswith("-"):
            if _takes_value(command, word):  # `--log-format json lab status`: skip `json`
                next(words, None)
            continue
        if not isinstance(command, click.Group):
            break
        found = command.get_command(click.Context(command), word)  # the lazy groups too
        if found is None:
            break
        command = found
        path.append(word)
    return " ".join(path)


def _json_logs(argv: list[str]) -> bool:
    """Whether the command line (or :data:`logs.FORMAT_ENV`) asks for JSON log lines: the
    root option's value as given, read here because an error may come before it is parsed."""
    given = None  # the last one given wins, as click reads a repeated option
    words = iter(argv)
    for word in words:
        if word == "--log-format":
            given = next(words, None)
        elif word.startswith("--log-format="):
            given = word.partition("=")[2]
        elif not word.startswith("-"):
            break  # the root's options come before the first command
    return (given or os.environ.get(logs.FORMAT_ENV)) == "json"


def _fail(message: str, code: int, argv: list[str]) -> NoReturn:
    """Say ``error: <message>`` on stderr and exit ``code``; with JSON logs, as one JSON
    log line (fresh-user finding: a log pipeline read every line but the error)."""
    if _json_logs(argv):
        record = logging.LogRecord("stormwatch", logging.ERROR, __file__, 0, message, None, None)
        record.exit_code = code
        click.echo(logs.JsonFormatter().format(record), err=True)
    else:
        click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point; maps :class:`StormwatchError` to a message and exit code."""
    words = sys.argv[1:] if argv is None else argv
    try:
        rv = root.main(args=argv, prog_name="stormwatch", standalone_mode=False)
        # A command may return an int to choose the exit status (e.g. demo: 1 when
        # the hypothesis did not hold); click's --help/--version return 0 or None.
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.exceptions.Abort:
        if _json_logs(words):
            _fail("aborted", 130, words)
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # click >= 8.2 raises this for a group given alone: its help, as click shows it
        if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            exc.show()
            sys.exit(exc.exit_code)
        # one line, in the style of every other error (click's own is Usage, Try, Error)
        where = exc.ctx.command_path if exc.ctx is not None else _command_path(words)
        message = exc.format_message().rstrip(".")
        _fail(f"{message} (see `{where} --help`)", exc.exit_code, words)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code, words)
    except StormwatchError as exc:
        _fail(str(exc), exc.exit_code, words)
    except KeyboardInterrupt:
        if _json_logs(words):
            _fail("interrupted", 130, words)
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        _fail(
            f"this command needs {exc.name}, which the core install (the agent's) "
            f"leaves out: pip install 'stormwatch[{extra}]'",
            2,
            words,
        )


__all__ = ["main", "root"]
