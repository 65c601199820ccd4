"""munged, slurmctld and the slurmds: their files, command lines, start and stop.

No systemd: each daemon is started directly and daemonises itself (the command
returns once it has forked), writing a pid file. ``munged`` runs as the ``munge`` user
(it insists that its key is owned by the user it runs as: 0400, ``munge``); slurmctld
and slurmd run as root.

A slurmd is started inside its node's network namespace with ``nsenter --net`` plus
``unshare --uts --mount`` (its own hostname, and the node's hosts file bind-mounted over
``/etc/hosts`` in a private mount namespace, so nothing is mounted on the host). ``ip
netns exec`` is not used: it remounts ``/sys`` and slurmd then refuses to start ("No
filesystem mounted on /sys/fs/cgroup"; issue 15).

Every daemon carries ``SLURM_CONF=<the cluster's slurm.conf>`` in its environment, and
so do the step daemons (``slurmstepd``) it forks and the jobs submitted through
:class:`~stormwatch.platforms.slurm.SlurmCommands`; every process started inside a node
also holds that node's ``/etc/hosts`` mount. :func:`cluster_processes` finds them by
both, so a stop needs no pid file and is safe after a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from stormwatch.lab.errors import ServiceFailedError, SlurmError
from stormwatch.lab.services import procs
from stormwatch.lab.slurm.config import SlurmClusterConfig, SlurmNode, SlurmPaths

log = logging.getLogger(__name__)

#: The Debian packages that bring the programs below (``--no-install-recommends``).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
#: Programs the cluster runs (daemons, clients, and util-linux for the namespaces).
TOOLS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "scontrol",
    "sinfo",
    "nsenter",
    "unshare",
    "setpriv",
)
#: The user munged runs as (created by Debian's ``munge`` package).
MUNGE_USER = "munge"
#: Bytes of a munge key (munge's ``mungekey`` default is 1024).
MUNGE_KEY_BYTES = 1024
#: Seconds a daemon's start command and its pid file may take (measured: milliseconds).
START_TIMEOUT_S = 15.0
#: Seconds between SIGTERM and SIGKILL at stop (the daemons exit in milliseconds; a job's
#: processes get this long to handle SIGTERM).
STOP_GRACE_S = 3.0


def require_tools() -> None:
    """Raises :class:`SlurmError` naming every missing program and the packages to install."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise SlurmError(
            f"missing {', '.join(missing)}; install them with "
            f"`apt-get install --no-install-recommends {' '.join(PACKAGES)}` (or `make system`)"
        )


def munge_account() -> tuple[int, int]:
    """uid and gid of :data:`MUNGE_USER`.

    Raises:
        SlurmError: there is no such user (the ``munge`` package is not installed).
    """
    try:
        entry = pwd.getpwnam(MUNGE_USER)
    except KeyError as exc:
        raise SlurmError(f"no user {MUNGE_USER!r}; apt-get install munge") from exc
    return entry.pw_uid, entry.pw_gid


def prepare_munge(paths: SlurmPaths) -> None:
    """Create munged's folder (``munge``, 0755) and a fresh key (``munge``, 0400).

    Raises:
        SlurmError: the ``munge`` user cannot reach the folder (a parent folder lacks
            search permission for it: pytest's and ``mktemp -d``'s folders are 0700).
    """
    uid, gid = munge_account()
    home = paths.munge_dir.parent
    home.mkdir(parents=True, exist_ok=True, mode=0o755)
    _check_reachable(home, uid, gid)
    paths.munge_dir.mkdir(parents=True, exist_ok=True)
    os.chown(paths.munge_dir, uid, gid)
    paths.munge_dir.chmod(0o755)
    paths.munge_key.unlink(missing_ok=True)
    fd = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, os.urandom(MUNGE_KEY_BYTES))
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def _check_reachable(folder: Path, uid: int, gid: int) -> None:
    for part in [folder, *folder.parents]:
        st = part.stat()
        mode = st.st_mode
        if mode & stat.S_IXOTH or (st.st_uid == uid and mode & stat.S_IXUSR):
            continue
        if st.st_gid == gid and mode & stat.S_IXGRP:
            continue
        raise SlurmError(
            f"user {MUNGE_USER!r} cannot enter {part} (mode {stat.filemode(mode)}), so munged "
            f"cannot reach its socket and key under it; `chmod o+x {part}` or use a run "
            "directory under a folder others can enter"
        )


def munged_command(paths: SlurmPaths) -> list[str]:
    """munged as the ``munge`` user, with every file in :attr:`SlurmPaths.munge_dir`."""
    return [
        "setpriv",
        f"--reuid={MUNGE_USER}",
        f"--regid={MUNGE_USER}",
        "--clear-groups",
        "munged",
        f"--socket={paths.munge_socket}",
        f"--key-file={paths.munge_key}",
        f"--pid-file={paths.munged_pid}",
        f"--log-file={paths.munged_log}",
        f"--seed-file={paths.munged_seed}",
    ]


def slurmctld_command(paths: SlurmPaths) -> list[str]:
    """slurmctld in the root namespace (it daemonises; pid file from slurm.conf)."""
    return ["slurmctld", "-f", str(paths.slurm_conf)]


#: Run inside the node's new UTS and mount namespaces: $1 hosts file, $2 node, $3 slurm.conf.
#: The resolv.conf beside the hosts file (no nameserver) goes over /etc/resolv.conf: the
#: host's resolver is unreachable from the namespace, and a lookup that misses the hosts
#: file (torch's reverse lookup of a peer's IPv4-mapped address) would wait for its timeout.
_NODE_SHELL = (
    'mount --bind "$1" /etc/hosts && '
    '{ [ ! -e /etc/resolv.conf ] || mount --bind "${1%/*}/resolv" /etc/resolv.conf; } && '
    'hostname "$2" && exec slurmd -f "$3" -N "$2"'
)


def slurmd_command(paths: SlurmPaths, node: SlurmNode) -> list[str]:
    """slurmd of ``node`` inside its network namespace, with its hostname and hosts file.

    ``--propagation private`` keeps the bind mount inside the new mount namespace: it
    goes away with the node's last process.
    """
    return [
        "nsenter",
        f"--net=/run/netns/{node.netns}",
        "--",
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _NODE_SHELL,
        "sh",
        str(paths.node_hosts(node.name)),
        node.name,
        str(paths.slurm_conf),
    ]


def start_daemon(
    service: str, argv: Sequence[str], *, pid_file: Path, log_file: Path, env: Mapping[str, str]
) -> int:
    """Run a self-daemonising ``argv`` and wait for its pid file; returns the daemon's pid.

    Raises:
        ServiceFailedError: the command failed, or no live pid appeared in ``pid_file``
            within :data:`START_TIMEOUT_S` (``service`` and ``log_file`` named, its tail
            in the message).
    """
    pid_file.unlink(missing_ok=True)
    try:
        done = subprocess.run(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceFailedError(
            f"{service} could not be started: {exc}", service=service, log_file=log_file
        ) from exc
    if done.returncode != 0:
        raise _failed(service, f"exit status {done.returncode}: {done.stderr.strip()}", log_file)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        pid = read_pid(pid_file)
        if pid is not None and psutil.pid_exists(pid):
            return pid
        time.sleep(0.02)
    raise _failed(service, f"no live pid in {pid_file} after {START_TIMEOUT_S:g} s", log_file)


def _failed(service: str, why: str, log_file: Path) -> ServiceFailedError:
    tail = procs.log_tail(log_file)
    return ServiceFailedError(
        f"{service} did not start: {why}" + (f"\n{log_file}:\n{tail}" if tail else ""),
        service=service,
        log_file=log_file,
    )


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` (None: no file, or not a number yet)."""
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cluster_processes(config: SlurmClusterConfig) -> list[psutil.Process]:
    """Every live process of the cluster: those whose environment names its ``slurm.conf``
    (daemons, step daemons, jobs) and those inside a node's mount namespace (anything a
    job started, whatever its environment). This process and its ancestors are spared."""
    paths = config.paths
    conf = str(paths.slurm_conf)
    marker = f" {paths.nodes_dir}/"
    spare = {os.getpid()}
    with contextlib.suppress(psutil.Error):  # a parent gone meanwhile is no candidate either
        spare.update(p.pid for p in psutil.Process().parents())
    own_mnt = _mount_ns(os.getpid())
    in_node: dict[str, bool] = {}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spare:
            continue
        try:
            if proc.environ().get("SLURM_CONF") == conf:
                found.append(proc)
                continue
        except psutil.Error:  # gone, or a kernel thread: no environment to read
            continue
        mnt = _mount_ns(proc.pid)
        if mnt is None or mnt == own_mnt:
            continue
        if mnt not in in_node:
            in_node[mnt] = _mentions(proc.pid, marker)
        if in_node[mnt]:
            found.append(proc)
    return found


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _mentions(pid: int, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False


def stop_processes(config: SlurmClusterConfig) -> None:
    """Stop every process of the cluster.

    Order: the jobs' processes, ``srun`` and the step daemons get SIGKILL right after SIGTERM
    (``slurmstepd`` ignores SIGTERM and ``srun`` only forwards it to a step that is
    going away: both would hold the stop for the whole grace period; cancel a job with
    ``scancel`` first to let it end gracefully); then slurmctld and the slurmds SIGTERM,
    SIGKILL after :data:`STOP_GRACE_S`; munged last (the others authenticate through it).
    A slurmd may fork a step while it is being stopped, so this sweeps again until
    nothing is found (at most three rounds).

    Raises:
        SlurmError: a process survived SIGKILL, or new ones kept appearing.
    """
    for _ in range(3):
        found = cluster_processes(config)
        if not found:
            return
        names = {p.pid: _name(p) for p in found}
        munge = [p for p in found if names[p.pid] == "munged"]
        daemon = [p for p in found if names[p.pid] in ("slurmctld", "slurmd")]
        jobs = [p for p in found if p not in munge and p not in daemon]
        survivors = procs.terminate(jobs, grace=0.0)
        survivors += procs.terminate(daemon, grace=STOP_GRACE_S)
        survivors += procs.terminate(munge, grace=STOP_GRACE_S)
        if survivors:
            raise SlurmError(f"Slurm cluster in {config.paths.root}: {survivors} survived SIGKILL")
    left = [f"pid {p.pid} {_name(p)}" for p in cluster_processes(config)]
    if left:
        raise SlurmError(f"Slurm cluster in {config.paths.root}: still running after stop: {left}")


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"


def runtime_files(config: SlurmClusterConfig) -> Iterable[Path]:
    """What a running cluster leaves on disk besides its configs and logs: pid files,
    spools, controller state, munge's key/socket/seed, node hosts files and devices, and
    the runtime folder when the cluster has one."""
    paths = config.paths
    if paths.runtime is not None:
        yield paths.runtime
    yield paths.state_dir
    yield paths.slurmctld_pid
    yield from (paths.munge_key, paths.munge_socket, paths.munged_pid, paths.munged_seed)
    yield paths.munge_socket.with_name(paths.munge_socket.name + ".lock")  # munged's own
    for node in config.nodes:
        yield paths.node_spool(node.name)
        yield paths.slurmd_pid(node.name)
        yield paths.node_hosts(node.name)
        yield paths.node_resolv(node.name)
        yield paths.node_devices(node.name)


def remove_runtime_files(config: SlurmClusterConfig) -> None:
    """Delete :func:`runtime_files` (those that exist); munged's log is kept in the
    cluster's log folder when its runtime folder goes."""
    paths = config.paths
    if paths.runtime is not None and paths.munged_log.exists():
        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.munged_log, paths.logs_dir / paths.munged_log.name)
    for path in runtime_files(config):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


__all__ = [
    "MUNGE_USER",
    "PACKAGES",
    "STOP_GRACE_S",
    "TOOLS",
    "cluster_processes",
    "munge_account",
    "munged_command",
    "prepare_munge",
    "read_pid",
    "remove_runtime_files",
    "require_tools",
    "runtime_files",
    "slurmctld_command",
    "slurmd_command",
    "start_daemon",
    "stop_processes",
]
