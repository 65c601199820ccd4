"""Which actions run for which alert: a mapping from alert name to action objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stormwatch.alerts.actions.base import Action
from stormwatch.alerts.actions.confirm_restart import ConfirmRestart, ConfirmRestartSettings
from stormwatch.alerts.actions.remedial import (
    CheckpointNow,
    CollectDiagnostics,
    ExcludeNodeRestart,
    NotifyOnly,
    RestartWorkers,
)
from stormwatch.alerts.policy import Policy
from stormwatch.clients import AsyncPrometheusAPI
from stormwatch.errors import ConfigError
from stormwatch.platforms import PlatformBackend

#: Alert names of the shipped rules (alerts/rules/*.yml) that have actions.
RANK_STALLED = "StormwatchRankStalled"


@dataclass(frozen=True)
class Playbook:
    """Alert name -> the actions to run, in order, when an incident of it opens.

    Args:
        actions: the mapping; an action object may serve several alerts, but
            two different objects must not share a ``kind``.

    Raises:
        ConfigError: two different actions share a ``kind``.
    """

    actions: Mapping[str, tuple[Action, ...]]

    def __post_init__(self) -> None:
        by_kind: dict[str, Action] = {}
        for alertname, actions in self.actions.items():
            for action in actions:
                other = by_kind.setdefault(action.kind, action)
                if other is not action:
                    raise ConfigError(
                        f"playbook[{alertname!r}]: two different actions have kind "
                        f"{action.kind!r}; kinds must be unique"
                    )

    def kinds_for(self, alertname: str) -> tuple[str, ...]:
        """Kinds of the actions for ``alertname`` (empty when it has none)."""
        return tuple(a.kind for a in self.actions.get(alertname, ()))

    def action(self, kind: str) -> Action | None:
        """The action object of ``kind``, or None when this playbook has none."""
        for actions in self.actions.values():
            for action in actions:
                if action.kind == kind:
                    return action
        return None

    def retry_safe(self, kind: str) -> bool:
        """Whether an interrupted action of ``kind`` may run again (unknown kinds: no)."""
        action = self.action(kind)
        return action is not None and action.retry_safe


def default_playbook(
    prometheus: AsyncPrometheusAPI | None, confirm: ConfirmRestartSettings | None = None
) -> Playbook:
    """The shipped playbook: ``StormwatchRankStalled`` -> ``confirm_restart``.

    Args:
        prometheus: the Prometheus API for read-only checks, or None (they are then skipped).
        confirm: timing of ``confirm_restart`` (defaults: :class:`ConfirmRestartSettings`).
    """
    return Playbook({RANK_STALLED: (ConfirmRestart(prometheus, confirm),)})


def playbook_from_policy(
    policy: Policy,
    *,
    prometheus: AsyncPrometheusAPI | None,
    backend: PlatformBackend | None,
    confirm: ConfirmRestartSettings | None = None,
) -> Playbook:
    """The playbook a policy describes: one action object per kind, shared by its alerts.

    Raises:
        ConfigError: the policy names a backend action but ``backend`` is None.
    """
    objects: dict[str, Action] = {
        "confirm_restart": ConfirmRestart(prometheus, confirm),
        "notify_only": NotifyOnly(),
    }
    if backend is not None:
        objects.update(
            {
                "restart_workers": RestartWorkers(backend, prometheus),
                "exclude_node_restart": ExcludeNodeRestart(backend, prometheus),
                "checkpoint_now": CheckpointNow(backend),
                "collect_diagnostics": CollectDiagnostics(backend),
            }
        )
    missing = sorted(policy.kinds() - set(objects))
    if missing:
        raise ConfigError(
            f"policy: actions {missing} need a platform backend; start the responder "
            "with --lab-run-dir (the lab backend) or --platform kubernetes|slurm"
        )
    return Playbook(
        {rule.alertname: tuple(objects[k] for k in rule.actions) for rule in policy.rules}
    )


__all__ = ["RANK_STALLED", "Playbook", "default_playbook", "playbook_from_policy"]
