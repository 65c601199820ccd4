"""Automatic actions the responder runs for incidents.

An :class:`Action` is a typed object with a ``kind``, a ``guard`` (why not to
run) and an async ``run``; a :class:`Playbook` maps alert names to actions.
Shipped: ``StormwatchRankStalled`` -> :class:`ConfirmRestart`.
"""

from stormwatch.alerts.actions.base import Action, ActionOutcome
from stormwatch.alerts.actions.confirm_restart import ConfirmRestart, ConfirmRestartSettings
from stormwatch.alerts.actions.playbook import RANK_STALLED, Playbook, default_playbook

__all__ = [
    "RANK_STALLED",
    "Action",
    "ActionOutcome",
    "ConfirmRestart",
    "ConfirmRestartSettings",
    "Playbook",
    "default_playbook",
]
