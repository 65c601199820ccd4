"""Checks of single target-file values, called by the field validators of
:mod:`stormwatch.platforms.targets` so that a bad value is refused when the file is
loaded, before anything starts: each returns the value or raises ``ValueError`` with the
fix (pydantic turns it into the field's :class:`~stormwatch.platforms.errors.TargetIssue`).

* placeholders of path patterns (``job.log_dir``: ``{job}``, ``{jobid}``);
* ``agents.host``: ``{node}`` / ``{addr}`` only, and a bare host name or IP once filled;
* ``job.submit.parameters``: environment variable names and values an environment can
  carry, and (Slurm, :func:`reserved_parameter_issues`) no name stormwatch or Slurm sets;
* files: a token file, a job template readable as UTF-8 text, and (:func:`slurm_issues`,
  not on a lab's target: the lab writes it) ``slurm.conf``, whose ``KillWait`` must not
  be longer than the target's ``grace_period_s`` (:mod:`stormwatch.platforms.stopping`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stormwatch.platforms.errors import TargetIssue

if TYPE_CHECKING:
    from stormwatch.platforms.targets import TargetFile

#: Placeholders of ``job.log_dir`` (:class:`~stormwatch.chaos.platform_target.JobLogDirs`).
LOG_DIR_FIELDS = ("job", "jobid")
#: Placeholders of ``agents.host``, with the stand-in values the filled host is checked on.
AGENT_HOST_SAMPLES = {"node": "node-1", "addr": "10.0.0.1"}
#: ``job.submit.parameters`` names refused on a Slurm target: the parameters are set in
#: ``sbatch``'s environment, and these would change how ``sbatch``, the batch script's
#: commands or its Python run (the commands found, the cluster's ``slurm.conf``).
RESERVED_PARAMETERS = ("PATH", "PYTHONPATH", "PYTHONHOME", "SLURM_CONF")
#: Name prefixes refused likewise: Slurm's own variables and the dynamic loader's.
RESERVED_PREFIXES = ("SLURM_", "LD_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_HOST_LABEL}(\.{_HOST_LABEL})*\.?")


def check_placeholders(pattern: str, fields: Sequence[str]) -> str:
    """``pattern`` when ``str.format`` of it needs only ``fields`` (keyword placeholders).

    Raises:
        ValueError: another placeholder, a positional one, or an unmatched brace.
    """
    try:
        pattern.format(**{name: "x" for name in fields})
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        allowed = " and ".join(f"{{{name}}}" for name in fields)
        raise ValueError(
            f"{pattern!r}: only {allowed} may be substituted ({type(exc).__name__}: {exc}); "
            "write a literal brace as {{ or }}"
        ) from exc
    return pattern


def check_agent_host(value: str) -> str:
    """``value`` when it needs only ``{node}`` / ``{addr}`` and, filled with
    :data:`AGENT_HOST_SAMPLES`, is a bare host name or IP (no scheme, path, port or spaces).

    Raises:
        ValueError: naming the problem and the fix.
    """
    check_placeholders(value, tuple(AGENT_HOST_SAMPLES))
    host = value.format(**AGENT_HOST_SAMPLES)
    if _HOST_NAME.fullmatch(host) or _is_ip(host):
        return value
    raise ValueError(
        f"{value!r} gives {host!r}, not a host name or IP: give only the host "
        "(agents.scheme and agents.port make the URL), e.g. {node} or {node}.ib.example.org"
    )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_parameters(parameters: Mapping[str, str]) -> Mapping[str, str]:
    """``parameters`` (``job.submit.parameters``) when every name is an environment
    variable name and no value holds a NUL byte or text the system cannot encode.

    Raises:
        ValueError: listing every bad name.
    """
    bad_names = [k for k in parameters if not _ENV_NAME.fullmatch(k)]
    bad_values = [k for k, v in parameters.items() if not _env_value_ok(v)]
    problems = []
    if bad_names:
        names = ", ".join(repr(k) for k in bad_names)
        problems.append(f"{names}: not environment variable names (A-Z, a-z, 0-9, _)")
    if bad_values:
        names = ", ".join(repr(k) for k in bad_values)
        problems.append(
            f"the values of {names} cannot be put in an environment (a NUL byte, or text "
            "that is not valid Unicode): remove those characters"
        )
    if problems:
        raise ValueError("; ".join(problems))
    return parameters


def _env_value_ok(value: str) -> bool:
    if "\0" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def reserved_parameter_issues(parameters: Mapping[str, str]) -> list[TargetIssue]:
    """One issue naming every ``job.submit.parameters`` name of a Slurm target that is
    reserved (:data:`RESERVED_PARAMETERS`, :data:`RESERVED_PREFIXES`); empty when none."""
    reserved = [
        k for k in parameters if k in RESERVED_PARAMETERS or k.startswith(RESERVED_PREFIXES)
    ]
    if not reserved:
        return []
    names = ", ".join(reserved)
    return [
        TargetIssue(
            "job.submit.parameters",
            f"{names}: reserved, they would change the commands, libraries or slurm.conf that "
            f"sbatch and the batch script use ({', '.join(RESERVED_PARAMETERS)} and every "
            f"{'*, '.join(RESERVED_PREFIXES)}* name); remove them from the parameters, or set "
            "them in the batch script (job.submit.template) itself",
        )
    ]


def slurm_issues(target: TargetFile) -> list[TargetIssue]:
    """What a ``slurm`` target file (not a lab's) must satisfy beyond its fields' types:
    ``slurm.conf`` is a file, and no reserved ``job.submit.parameters`` name
    (:func:`reserved_parameter_issues`)."""
    issues = []
    conf = target.slurm.conf
    if conf is not None and not conf.is_file():
        what = "a folder, not a file" if conf.is_dir() else "not a file"
        fix = "give the cluster's slurm.conf, or leave slurm.conf out (SLURM_CONF, the system's)"
        issues.append(TargetIssue("slurm.conf", f"{conf} is {what}; {fix}"))
    kill_wait = None if conf is None or not conf.is_file() else slurm_kill_wait(conf)
    if kill_wait is not None and kill_wait > target.grace_period_s:
        issues.append(
            TargetIssue(
                "grace_period_s",
                f"{target.grace_period_s} s is shorter than KillWait={kill_wait} in {conf} "
                "(Slurm sends SIGKILL only KillWait seconds after SIGTERM): give "
                f"grace_period_s: {kill_wait} or more, or lower the cluster's KillWait",
            )
        )
    if target.job is not None and target.job.submit is not None:
        issues.extend(reserved_parameter_issues(target.job.submit.parameters))
    return issues


#: ``KillWait=<seconds>`` in ``slurm.conf`` (keys are case-insensitive, slurm.conf(5)).
_KILL_WAIT = re.compile(r"^\s*KillWait\s*=\s*(\d+)\s*(?:#.*)?$", re.IGNORECASE | re.MULTILINE)
#: Slurm's ``KillWait`` when ``slurm.conf`` does not set it (slurm.conf(5)).
SLURM_DEFAULT_KILL_WAIT = 30


def slurm_kill_wait(conf: Path) -> int | None:
    """``KillWait`` of ``conf`` (the last one given; :data:`SLURM_DEFAULT_KILL_WAIT` when
    unset), None when the file cannot be read as text (its other checks say so)."""
    try:
        text = conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _KILL_WAIT.findall(text)
    return int(found[-1]) if found else SLURM_DEFAULT_KILL_WAIT


def check_file(path: Path | None, fix: str) -> Path | None:
    """``path`` when it is None or an existing file.

    Raises:
        ValueError: ``<path> is not a file`` (or is a folder), then ``fix``.
    """
    if path is None or path.is_file():
        return path
    what = "a folder, not a file" if path.is_dir() else "not a file"
    raise ValueError(f"{path} is {what}; {fix}")


def check_text_file(path: Path, fix: str) -> Path:
    """``path`` when it is a file that reads as UTF-8 text (a job template).

    Raises:
        ValueError: not a file, unreadable, or not UTF-8 (the byte offset).
    """
    check_file(path, fix)
    try:
        path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: cannot read it as UTF-8 text (byte {exc.start}); {fix}") from exc
    return path


__all__ = [
    "AGENT_HOST_SAMPLES",
    "LOG_DIR_FIELDS",
    "RESERVED_PARAMETERS",
    "RESERVED_PREFIXES",
    "SLURM_DEFAULT_KILL_WAIT",
    "check_agent_host",
    "check_file",
    "check_parameters",
    "check_placeholders",
    "check_text_file",
    "reserved_parameter_issues",
    "slurm_issues",
    "slurm_kill_wait",
]
