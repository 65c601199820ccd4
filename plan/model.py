"""Analytic checkpoint/restart model: optimal interval and effective training time ratio.

Notation (seconds): ``tau`` compute time between checkpoints, ``delta`` time to
write one checkpoint (training blocked), ``mttf`` job-level mean time to failure
``M = 1/lambda`` (failures are a Poisson process in running time), ``downtime``
the mean time lost per failure outside running: detect + recover + checkpoint load.

ETTR (effective training time ratio) is productive training time divided by
wall-clock time, as defined for goodput in Kokolis et al., "Revisiting
Reliability in Large-Scale Machine Learning Research Clusters", arXiv:2410.21680.

Two ETTR models are given:

* :func:`ettr_first_order` — the usual back-of-envelope model: each failure
  loses ``downtime`` plus on average half a checkpoint period ``(tau+delta)/2`` of
  work; each period pays ``delta``::

      ETTR = tau/(tau+delta) * (1 - (downtime + (tau+delta)/2) / M)

  Accurate while ``(tau+delta) << M``.
* :func:`ettr_renewal` — exact under the same assumptions (exponential
  inter-arrival in running time, no failures while down): a period of
  ``w = tau+delta`` succeeds with probability ``exp(-w/M)``; its expected wall
  time is ``(exp(w/M) - 1) * (M + downtime)``, so ``ETTR = tau / that``.
  This is what the Monte Carlo simulation (:mod:`.montecarlo`) converges to.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def young_interval(delta: float, mttf: float) -> float:
    """Young's first-order optimum checkpoint interval ``sqrt(2 * delta * M)`` (s).

    J. W. Young, "A first order approximation to the optimum checkpoint interval",
    Communications of the ACM 17(9), 1974.
    """
    _check_positive(delta=delta, mttf=mttf)
    return math.sqrt(2.0 * delta * mttf)


def daly_interval(delta: float, mttf: float) -> float:
    """Daly's higher-order optimum checkpoint interval (s of compute between checkpoints).

    J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
    restart dumps", Future Generation Computer Systems 22(3), 2006, eq. (37)::

        tau = sqrt(2 delta M) * [1 + 1/3 sqrt(delta/(2M)) + 1/9 (delta/(2M))] - delta   (delta < 2M)
        tau = M                                                                         (delta >= 2M)
    """
    _check_positive(delta=delta, mttf=mttf)
    if delta >= 2.0 * mttf:
        return mttf
    x = delta / (2.0 * mttf)
    return math.sqrt(2.0 * delta * mttf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def ettr_first_order(tau: float, delta: float, mttf: float, downtime: float) -> float:
    """First-order ETTR in [0, 1] (see module docstring)."""
    _check_positive(tau=tau, delta=delta, mttf=mttf)
    period = tau + delta
    value = tau / period * (1.0 - (downtime + period / 2.0) / mttf)
    return min(1.0, max(0.0, value))


def ettr_renewal(tau: float, delta: float, mttf: float, downtime: float) -> float:
    """Exact renewal-model ETTR in [0, 1] (see module docstring)."""
    _check_positive(tau=tau, delta=delta, mttf=mttf)
    try:
        expected_wall = math.expm1((tau + delta) / mttf) * (mttf + downtime)
    except OverflowError:  # math.expm1 raises instead of returning inf: a period of many MTTFs
        return 0.0
    return tau / expected_wall if math.isfinite(expected_wall) else 0.0


EttrModel = Callable[[float, float, float, float], float]


def solve_downtime_for_target(
    target: float,
    delta: float,
    mttf: float,
    *,
    model: EttrModel = ettr_renewal,
    tol: float = 1e-3,
) -> float | None:
    """Largest mean downtime per failure (s) that still reaches ``target`` ETTR.

    The interval is Daly's optimum for ``delta``/``mttf`` (it does not depend on
    the downtime). ETTR falls monotonically with downtime, so bisection applies.

    Returns:
        The downtime (s), or ``None`` when even zero downtime misses ``target``
        (checkpoint cost and lost work alone are too high).

    Raises:
        ValueError: ``target`` not in (0, 1).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target: must be in (0, 1) (got {target})")
    tau = daly_interval(delta, mttf)
    if model(tau, delta, mttf, 0.0) < target:
        return None
    lo, hi = 0.0, mttf
    while model(tau, delta, mttf, hi) >= target:
        hi *= 2.0
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        if model(tau, delta, mttf, mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}: must be a finite number > 0 (got {value})")


__all__ = [
    "EttrModel",
    "daly_interval",
    "ettr_first_order",
    "ettr_renewal",
    "solve_downtime_for_target",
    "young_interval",
]
