"""The agents' Bearer token of a ledger row's target, read from its token file when used.

The row (:class:`stormwatch.contracts.fault_ledger.FaultTarget`) holds only the file's
path, never the token, so a ledger or journal can be shared without the secret.
"""

from __future__ import annotations

from pathlib import Path

from stormwatch.chaos.errors import FaultError
from stormwatch.contracts.fault_ledger import FaultTarget


def agent_token(target: FaultTarget, fault_id: str) -> str:
    """The agents' Bearer token for ``fault_id``, read from ``target.token_file`` now.

    Raises:
        FaultError: no token file, or it cannot be read (naming fault and file).
    """
    if target.token_file is None:
        raise FaultError(f"fault {fault_id}: its target has no agent token file")
    try:
        return Path(target.token_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise FaultError(
            f"fault {fault_id}: cannot read the agent token {target.token_file}: {exc.strerror}"
        ) from exc


__all__ = ["agent_token"]
