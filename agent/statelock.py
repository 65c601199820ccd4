"""One agent per state directory: an exclusive ``flock`` on ``<state-dir>/agent.lock``.

Two agents sharing a state dir would share the fault ledger and the span file
(and revert each other's faults). The lock is taken before anything else in the
state dir is opened and held for the agent's life; the kernel drops it when the
process dies, so a crashed agent never leaves a stale lock. The file holds the
holder's pid, for the error message of the next agent that tries.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from stormwatch.agent.errors import AgentConfigError

LOCK_NAME = "agent.lock"


class StateDirLock:
    """Hold ``<state_dir>/agent.lock`` exclusively until :meth:`release`.

    Args:
        state_dir: the agent's state directory (created, with parents, mode 0700).

    Raises:
        AgentConfigError: another agent holds the lock (message names the state
            dir and the holder's pid), or the directory cannot be created.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        try:
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AgentConfigError(
                f"state_dir: cannot use {state_dir}: {exc.strerror}; pass a writable --state-dir"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise AgentConfigError(
                f"state_dir: {state_dir} is in use by another agent (pid {holder}); "
                "give each agent its own --state-dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


__all__ = ["LOCK_NAME", "StateDirLock"]
