"""The soak's actions on the lab (:class:`stormwatch.lab.Lab`): start, stop, a node
leaving and rejoining the elastic job (:mod:`stormwatch.chaos.gameday.soak`)."""

from __future__ import annotations

from stormwatch.chaos.gameday.soak import SoakActions, SoakPlan
from stormwatch.lab import Lab
from stormwatch.lab.config import JobSpec

#: Steps of the soak's job: more than any soak trains (it is stopped at the end).
SOAK_STEPS = 1_000_000


def lab_actions(lab: Lab, plan: SoakPlan) -> SoakActions:
    """Start/stop the soak's elastic job on ``lab``; node 1 leaves and rejoins it.

    Raises:
        StormwatchError: the lab is not up (reading its state).
    """
    state = lab.state
    nodes = [n.name for n in state.nodes[: state.config.job_nodes]]
    leaving = nodes[-1]
    spec = JobSpec(
        name=plan.job,
        steps=SOAK_STEPS,
        checkpoint_every=plan.checkpoint_every,
        step_delay=plan.step_delay,
        min_nodes=1,
        extra_args=("--eval-every", str(plan.eval_every), "--eval-seconds", str(plan.eval_seconds)),
    )

    def start() -> str:
        info = lab.start_job(spec)
        return f"job {info.name} on {', '.join(nodes)} (elastic 1:{len(nodes)})"

    def stop() -> str:
        result = lab.stop_job(plan.job)
        return f"stopped (exit codes {dict(result.exit_codes)})"

    def leave() -> str:
        lab.leave_job_node(plan.job, leaving)
        return f"{leaving} left the job"

    def rejoin() -> str:
        lab.rejoin_job_node(plan.job, leaving)
        return f"{leaving} rejoined the job"

    return SoakActions(start=start, stop=stop, leave=leave, rejoin=rejoin)


__all__ = ["SOAK_STEPS", "lab_actions"]
